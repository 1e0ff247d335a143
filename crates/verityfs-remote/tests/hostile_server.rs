//! A server that lies, against the remote store directly: what a
//! malicious server can do is deny service within the timeout, never make
//! the daemon hold unbounded memory nor fail reads after it stops lying.
//! The server is a few lines of this test's own on 127.0.0.1, since no
//! real server misbehaves on request.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use verityfs::image::Store;
use verityfs_remote::{RemoteOptions, RemoteStore};

/// The object every server here serves.
const OBJECT: usize = 8192;

fn contents() -> Vec<u8> {
    (0..OBJECT).map(|i| (i * 7 % 251) as u8).collect()
}

/// How the server answers its `n`-th request for `range` of the object.
type Answer = dyn Fn(usize, (usize, usize), &mut TcpStream) + Send + Sync;

/// Serves on 127.0.0.1 with `answer`; returns the URL.
fn serve(answer: Arc<Answer>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (answer, count) = (answer.clone(), count.clone());
            std::thread::spawn(move || serve_connection(stream, &*answer, &count));
        }
    });
    url
}

/// Answers the requests of one connection (kept alive).
fn serve_connection(mut stream: TcpStream, answer: &Answer, count: &AtomicUsize) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    loop {
        let mut range = (0, OBJECT - 1);
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
            if let Some(r) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                let (a, b) = r.trim().split_once('-').unwrap();
                range = (a.parse().unwrap(), b.parse().unwrap_or(OBJECT - 1));
            }
        }
        answer(count.fetch_add(1, Ordering::SeqCst), range, &mut stream);
    }
}

/// A `206` for `range`, claiming the object has `total` bytes.
fn partial(stream: &mut TcpStream, (a, b): (usize, usize), total: usize) {
    let b = b.min(OBJECT - 1);
    let head = format!(
        "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{total}\r\nContent-Length: {}\r\n\r\n",
        b + 1 - a
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(&contents()[a..=b]);
}

fn store(url: &str) -> RemoteStore {
    let options = RemoteOptions {
        timeout: Duration::from_secs(3),
        ..RemoteOptions::default()
    };
    RemoteStore::http(url, options).unwrap()
}

fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

#[test]
fn an_endless_body_fails_the_read_without_filling_memory() {
    let url = serve(Arc::new(
        |_, (a, b): (usize, usize), stream: &mut TcpStream| {
            let head = format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{OBJECT}\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
            let _ = stream.write_all(head.as_bytes());
            let chunk = [b'x'; 65536];
            while stream
                .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                .is_ok()
            {
                if stream.write_all(&chunk).is_err() || stream.write_all(b"\r\n").is_err() {
                    return;
                }
            }
        },
    ));
    let object = store(&url).open("object").unwrap();
    let before = resident_bytes();
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    assert!(
        object.read_exact_at(&mut buf, 0).is_err(),
        "a body longer than its range"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let grown = resident_bytes().saturating_sub(before);
    assert!(grown < 64 << 20, "grew by {grown} bytes");
}

#[test]
fn a_size_lied_about_once_does_not_fail_later_reads() {
    // The first answer says the object ends after 4096 bytes; then the truth.
    let url = serve(Arc::new(|n, range, stream: &mut TcpStream| {
        let total = if n == 0 { 4096 } else { OBJECT };
        partial(stream, (range.0, range.1.min(total - 1)), total)
    }));
    let object = store(&url).open("object").unwrap();
    let mut buf = [0u8; 4096];
    object.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf[..] == contents()[..4096]);
    object.read_exact_at(&mut buf, 4096).unwrap();
    assert!(
        buf[..] == contents()[4096..],
        "read past the size once claimed"
    );
}

#[test]
fn a_chunk_is_read_while_the_rest_of_its_request_is_on_its_way() {
    const CHUNK: usize = 2 << 20;
    const TOTAL: usize = 3 * CHUNK;
    // The first chunk of whatever is asked for, then nothing for longer
    // than the store waits.
    let url = serve(Arc::new(
        |_, (a, b): (usize, usize), stream: &mut TcpStream| {
            if a >= TOTAL {
                let head = format!(
                "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{TOTAL}\r\nContent-Length: 0\r\n\r\n"
            );
                let _ = stream.write_all(head.as_bytes());
                return;
            }
            let b = b.min(TOTAL - 1);
            let head = format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{TOTAL}\r\nContent-Length: {}\r\n\r\n",
            b + 1 - a
        );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&vec![7u8; CHUNK.min(b + 1 - a)]);
            std::thread::sleep(Duration::from_secs(10));
        },
    ));
    let object = store(&url).open("object").unwrap();
    // One request for the three chunks.
    object.prefetch(0, TOTAL as u64);
    let mut buf = [0u8; 4096];
    object
        .read_exact_at(&mut buf, 0)
        .expect("the first chunk, arrived while the others have not");
    assert!(buf.iter().all(|&b| b == 7));
}
