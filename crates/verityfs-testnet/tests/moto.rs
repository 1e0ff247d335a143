//! moto's S3 server: buckets, objects and byte ranges over plain HTTP, also
//! through the proxy.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use verityfs_testnet::http::{self, TIMEOUT};
use verityfs_testnet::{Faults, Moto, Proxy};

/// moto checks no signature, but reads an object only with an
/// `Authorization` header; this one is well-formed and signs nothing.
const AUTHORIZATION: (&str, &str) = (
    "Authorization",
    "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/s3/aws4_request, \
     SignedHeaders=host, Signature=00",
);

fn start() -> Moto {
    let started = Instant::now();
    let moto = Moto::start().unwrap();
    println!("moto started in {:?}", started.elapsed());
    moto
}

#[test]
fn stores_objects_and_serves_ranges() {
    let moto = start();
    assert!(moto.endpoint().starts_with("http://127.0.0.1:"));
    moto.create_bucket("images").unwrap();
    let listing = http::get(&format!("{}/", moto.endpoint()), None).unwrap();
    assert_eq!(listing.status, 200);
    assert!(String::from_utf8_lossy(&listing.body).contains("<Name>images</Name>"));

    let data: Vec<u8> = (0..=255).cycle().take(5000).collect();
    moto.put_object("images", "dir/image.img", &data).unwrap();
    let url = format!("{}/images/dir/image.img", moto.endpoint());
    let range =
        http::request("GET", &url, &[AUTHORIZATION, ("Range", "bytes=10-19")], &[]).unwrap();
    assert_eq!(range.status, 206);
    assert_eq!(range.body, &data[10..20]);
    assert_eq!(range.header("content-range"), Some("bytes 10-19/5000"));
    let whole = http::request("GET", &url, &[AUTHORIZATION], &[]).unwrap();
    assert_eq!(whole.body, data);
    // Anonymous reads of a private object are refused.
    assert_eq!(http::get(&url, None).unwrap().status, 403);
    // A missing bucket is an error with moto's answer.
    let error = moto.put_object("missing", "key", b"x").unwrap_err();
    assert!(error.to_string().contains("404"), "{error}");
}

#[test]
fn takes_uploads_and_reads_through_the_proxy() {
    let moto = start();
    moto.create_bucket("bucket").unwrap();
    let proxy = Proxy::start(moto.addr()).unwrap();
    let url = format!("{}bucket/sized", proxy.url());
    let octets = ("Content-Type", "application/octet-stream");
    let put = http::request("PUT", &url, &[AUTHORIZATION, octets], b"sized body").unwrap();
    assert_eq!(put.status, 200);

    // A chunked upload, as a streaming client sends one.
    let mut stream = TcpStream::connect(proxy.addr()).unwrap();
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    write!(
        stream,
        "PUT /bucket/chunked HTTP/1.1\r\nHost: test\r\n{}: {}\r\n\
         Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n\
         7\r\nchunked\r\n5\r\n body\r\n0\r\n\r\n",
        AUTHORIZATION.0, AUTHORIZATION.1
    )
    .unwrap();
    let mut response = Vec::new();
    // moto closes each connection after its response.
    stream.read_to_end(&mut response).unwrap();
    assert!(
        response.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&response)
    );

    for (key, body) in [("sized", &b"sized body"[..]), ("chunked", b"chunked body")] {
        let url = format!("{}bucket/{key}", proxy.url());
        let range =
            http::request("GET", &url, &[AUTHORIZATION, ("Range", "bytes=1-4")], &[]).unwrap();
        assert_eq!(range.status, 206);
        assert_eq!(range.body, &body[1..5]);
    }
    proxy.set(Faults {
        flip_byte_at: Some(0),
        ..Faults::default()
    });
    let flipped = http::request("GET", &url, &[AUTHORIZATION], &[]).unwrap();
    assert_eq!(flipped.body, b"\x8cized body");
    assert_eq!(proxy.requests(), 5);
}
