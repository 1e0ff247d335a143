//! The fault-injecting proxy, in front of a real nginx.

use std::fs;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use verityfs_testnet::http::{self, Connection, TIMEOUT};
use verityfs_testnet::{Faults, Nginx, Proxy};

/// The served file's length: a body of several copy buffers.
const LEN: usize = 1 << 20;

/// A deterministic, position-dependent pattern: a misplaced byte shows.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// nginx serving `/data` (and `/other`, the same bytes), and a proxy to it.
struct Setup {
    proxy: Proxy,
    nginx: Nginx,
    _root: TempDir,
}

impl Setup {
    fn new() -> Setup {
        Setup::with_len(LEN)
    }

    fn with_len(len: usize) -> Setup {
        let root = tempfile::tempdir().unwrap();
        fs::write(root.path().join("data"), pattern(len)).unwrap();
        fs::write(root.path().join("other"), pattern(len)).unwrap();
        let nginx = Nginx::serve(root.path()).unwrap();
        let proxy = Proxy::start(nginx.addr()).unwrap();
        Setup {
            proxy,
            nginx,
            _root: root,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.proxy.url())
    }

    /// Sends a GET for `path` on a new raw connection to the proxy.
    fn raw_get(&self, path: &str) -> TcpStream {
        let mut stream = TcpStream::connect(self.proxy.addr()).unwrap();
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
        write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
        stream
    }
}

/// Reads `stream` to its end or first error: the bytes read and the error.
fn read_all(stream: &mut TcpStream) -> (Vec<u8>, Option<io::Error>) {
    let mut bytes = Vec::new();
    let mut buf = [0; 65536];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return (bytes, None),
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e) => return (bytes, Some(e)),
        }
    }
}

/// The body part of a raw response.
fn body_of(response: &[u8]) -> &[u8] {
    let end = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    &response[end + 4..]
}

#[test]
fn forwards_ranges_on_kept_alive_connections() {
    let setup = Setup::new();
    let mut connection = Connection::open(setup.proxy.addr()).unwrap();
    let whole = connection.send("GET", "/data", &[], &[]).unwrap();
    assert_eq!(whole.status, 200);
    assert_eq!(whole.body, pattern(LEN));
    let range = connection
        .send("GET", "/data", &[("Range", "bytes=10-19")], &[])
        .unwrap();
    assert_eq!(range.status, 206);
    assert_eq!(range.body, &pattern(LEN)[10..20]);
    let head = connection.send("HEAD", "/data", &[], &[]).unwrap();
    assert_eq!(
        head.header("content-length"),
        Some(LEN.to_string().as_str())
    );
    assert!(head.body.is_empty());
    assert_eq!(setup.proxy.requests(), 3);
    // One client connection, so one upstream connection.
    let requests = setup.nginx.requests().unwrap();
    assert_eq!(requests.len(), 3);
    assert!(requests
        .iter()
        .all(|r| r.connection == requests[0].connection));
    assert_eq!(requests[1].range.as_deref(), Some("bytes=10-19"));
}

#[test]
fn latency_delays_each_request() {
    let setup = Setup::new();
    setup.proxy.set(Faults {
        latency: Duration::from_millis(20),
        ..Faults::default()
    });
    let mut connection = Connection::open(setup.proxy.addr()).unwrap();
    for _ in 0..3 {
        let started = Instant::now();
        let response = connection
            .send("GET", "/data", &[("Range", "bytes=0-0")], &[])
            .unwrap();
        assert_eq!(response.status, 206);
        assert!(started.elapsed() >= Duration::from_millis(20));
    }
}

#[test]
fn truncation_sends_the_head_and_part_of_the_body() {
    let setup = Setup::new();
    setup.proxy.set(Faults {
        truncate_after: Some(100),
        ..Faults::default()
    });
    let (response, error) = read_all(&mut setup.raw_get("/data"));
    assert!(error.is_none(), "{error:?}");
    assert!(response.starts_with(b"HTTP/1.1 200 OK\r\n"));
    let expected_length = format!("Content-Length: {LEN}\r\n");
    assert!(response
        .windows(expected_length.len())
        .any(|w| w == expected_length.as_bytes()));
    assert_eq!(body_of(&response), &pattern(LEN)[..100]);
    // A client reading the response sees it end early.
    let error = http::get(&setup.url("data"), None).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof, "{error}");
    // A body within the limit is whole.
    let range = http::get(&setup.url("data"), Some(0..=99)).unwrap();
    assert_eq!(range.body, &pattern(LEN)[..100]);
}

#[test]
fn reset_breaks_the_connection() {
    let setup = Setup::new();
    setup.proxy.set(Faults {
        reset_after: Some(100),
        ..Faults::default()
    });
    let (response, error) = read_all(&mut setup.raw_get("/data"));
    assert_eq!(
        error.map(|e| e.kind()),
        Some(io::ErrorKind::ConnectionReset)
    );
    // A reset may discard bytes in flight: at most the head and 100 bytes.
    if let Some(end) = response.windows(4).position(|w| w == b"\r\n\r\n") {
        assert!(response.len() - (end + 4) <= 100);
    }
}

#[test]
fn flips_one_byte_of_each_body() {
    let setup = Setup::new();
    setup.proxy.set(Faults {
        flip_byte_at: Some(70_000),
        ..Faults::default()
    });
    let mut expected = pattern(LEN);
    expected[70_000] ^= 0xff;
    let mut connection = Connection::open(setup.proxy.addr()).unwrap();
    for _ in 0..2 {
        let response = connection.send("GET", "/data", &[], &[]).unwrap();
        assert_eq!(response.body, expected);
    }
    // The offset is the body's, whatever range it is.
    let range = connection
        .send("GET", "/data", &[("Range", "bytes=69990-70009")], &[])
        .unwrap();
    assert_eq!(range.body, &pattern(LEN)[69_990..70_010]);
    let range = connection
        .send("GET", "/data", &[("Range", "bytes=0-70009")], &[])
        .unwrap();
    assert_eq!(range.body, &expected[..70_010]);
}

#[test]
fn status_answers_without_the_server_and_keeps_the_connection() {
    let setup = Setup::new();
    setup.proxy.set(Faults {
        status: Some(503),
        only_path_containing: Some("data".into()),
        ..Faults::default()
    });
    let mut connection = Connection::open(setup.proxy.addr()).unwrap();
    let refused = connection.send("GET", "/data", &[], &[]).unwrap();
    assert_eq!(refused.status, 503);
    assert!(refused.body.is_empty());
    // A request the filter leaves out, and after clearing the faults.
    let other = connection
        .send("GET", "/other", &[("Range", "bytes=0-9")], &[])
        .unwrap();
    assert_eq!(other.status, 206);
    setup.proxy.set(Faults::default());
    let data = connection
        .send("GET", "/data", &[("Range", "bytes=0-9")], &[])
        .unwrap();
    assert_eq!(data.status, 206);
    let uris: Vec<_> = setup
        .nginx
        .requests()
        .unwrap()
        .into_iter()
        .map(|r| r.uri)
        .collect();
    assert_eq!(uris, ["/other", "/data"]);
    assert_eq!(setup.proxy.requests(), 3);
}

#[test]
fn stalled_requests_are_answered_once_the_stall_is_cleared() {
    let setup = Setup::new();
    setup.proxy.set(Faults {
        stall: true,
        ..Faults::default()
    });
    let mut stream = setup.raw_get("/data");
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let error = stream.read(&mut [0; 1]).unwrap_err();
    assert!(
        matches!(
            error.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "{error}"
    );
    assert_eq!(setup.proxy.requests(), 1);
    assert!(setup.nginx.requests().unwrap().is_empty());
    setup.proxy.set(Faults::default());
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut head = [0; 12];
    stream.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
}

#[test]
fn dropping_the_proxy_closes_stalled_connections() {
    let setup = Setup::new();
    setup.proxy.set(Faults {
        stall: true,
        ..Faults::default()
    });
    let mut stalled = setup.raw_get("/data");
    let mut idle = TcpStream::connect(setup.proxy.addr()).unwrap();
    idle.set_read_timeout(Some(TIMEOUT)).unwrap();
    // Wait until the proxy has read the stalled request.
    let started = Instant::now();
    while setup.proxy.requests() == 0 {
        assert!(
            started.elapsed() < TIMEOUT,
            "the proxy never read the request"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let Setup {
        proxy,
        nginx,
        _root,
    } = setup;
    // Returns only once every thread of the proxy has ended.
    drop(proxy);
    assert_eq!(read_all(&mut stalled).0, b"");
    assert_eq!(read_all(&mut idle).0, b"");
    assert!(nginx.requests().unwrap().is_empty());
}

#[test]
fn an_unreachable_server_gets_a_bad_gateway() {
    let setup = Setup::new();
    let Setup {
        proxy,
        nginx,
        _root,
    } = setup;
    drop(nginx);
    let response = http::get(&proxy.url(), None).unwrap();
    assert_eq!(response.status, 502);
}

#[test]
fn streaming_throughput() {
    // Not a timing assertion: the figure shows in `--nocapture` output.
    const BIG: usize = 64 << 20;
    let setup = Setup::with_len(BIG);
    for (name, addr) in [("nginx", setup.nginx.addr()), ("proxy", setup.proxy.addr())] {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
        let started = Instant::now();
        write!(
            stream,
            "GET /data HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut read = 0;
        let mut buf = vec![0; 1 << 20];
        loop {
            match stream.read(&mut buf).unwrap() {
                0 => break,
                n => read += n,
            }
        }
        let elapsed = started.elapsed();
        assert!(read > BIG);
        println!(
            "{} MiB from {name}: {:.0} MB/s",
            BIG >> 20,
            read as f64 / elapsed.as_secs_f64() / 1e6
        );
    }
}
