//! The private nginx: files and byte ranges served, and the access log
//! read back.

use std::fs;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::time::Instant;

use verityfs_testnet::http::{self, Connection};
use verityfs_testnet::{Nginx, Request};

/// A deterministic, position-dependent pattern: a misplaced range shows.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn serves_files_and_ranges_and_logs_them() {
    let root = tempfile::tempdir().unwrap();
    let data = pattern(1000);
    fs::write(root.path().join("file"), &data).unwrap();
    let started = Instant::now();
    let nginx = Nginx::serve(root.path()).unwrap();
    println!("nginx started in {:?}", started.elapsed());
    assert!(nginx.url().starts_with("http://127.0.0.1:"));
    assert!(nginx.requests().unwrap().is_empty());

    let whole = http::get(&format!("{}file", nginx.url()), None).unwrap();
    assert_eq!(whole.status, 200);
    assert_eq!(whole.body, data);
    let range = http::get(&format!("{}file", nginx.url()), Some(10..=19)).unwrap();
    assert_eq!(range.status, 206);
    assert_eq!(range.body, &data[10..20]);
    assert_eq!(range.header("content-range"), Some("bytes 10-19/1000"));
    let missing = http::get(&format!("{}missing", nginx.url()), None).unwrap();
    assert_eq!(missing.status, 404);

    let requests = nginx.requests().unwrap();
    let summary: Vec<_> = requests
        .iter()
        .map(|r| {
            (
                r.method.as_str(),
                r.uri.as_str(),
                r.status,
                r.range.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("GET", "/file", 200, None),
            ("GET", "/file", 206, Some("bytes=10-19")),
            ("GET", "/missing", 404, None),
        ]
    );
    assert_eq!(requests[0].body_bytes_sent, 1000);
    assert_eq!(requests[1].body_bytes_sent, 10);
    // Reading the log again sees the same requests, none of its own.
    assert_eq!(nginx.requests().unwrap(), requests);
}

#[test]
fn keeps_connections_alive() {
    let root = tempfile::tempdir().unwrap();
    fs::write(root.path().join("file"), pattern(100)).unwrap();
    let nginx = Nginx::serve(root.path()).unwrap();
    let mut connection = Connection::open(nginx.addr()).unwrap();
    for _ in 0..3 {
        let response = connection
            .send("GET", "/file", &[("Range", "bytes=0-9")], &[])
            .unwrap();
        assert_eq!(response.body, &pattern(100)[..10]);
    }
    let requests: Vec<Request> = nginx.requests().unwrap();
    assert_eq!(requests.len(), 3);
    assert!(requests
        .iter()
        .all(|r| r.connection == requests[0].connection));
}

#[test]
fn serves_files_only_root_may_read() {
    // The tests run as root; nginx must not drop to another user.
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("private");
    fs::write(&file, b"secret").unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
    let nginx = Nginx::serve(root.path()).unwrap();
    let response = http::get(&format!("{}private", nginx.url()), None).unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.body, b"secret");
}

#[test]
fn is_gone_once_dropped() {
    let root = tempfile::tempdir().unwrap();
    let nginx = Nginx::serve(root.path()).unwrap();
    let addr = nginx.addr();
    TcpStream::connect(addr).unwrap();
    drop(nginx);
    TcpStream::connect(addr).unwrap_err();
}

#[test]
fn a_missing_root_is_an_error() {
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("missing");
    let error = Nginx::serve(&missing).err().unwrap();
    assert!(error.to_string().contains("missing"), "{error}");
}
