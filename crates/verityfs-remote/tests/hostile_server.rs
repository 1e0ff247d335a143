//! A server that lies, against the remote store directly: what a
//! malicious server can do is deny service within the timeout, never make
//! the daemon hold unbounded memory nor fail reads after it stops lying.
//! The server is a few lines of this test's own on 127.0.0.1, since no
//! real server misbehaves on request.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use verityfs::image::{open_manifest, publish, ManifestTrust, Store, MANIFEST_NAME};
use verityfs::{MerkleTreeParams, ReadOptions, Verifier};
use verityfs_remote::{RemoteOptions, RemoteStore};

/// The object every server here serves.
const OBJECT: usize = 8192;

fn contents() -> Vec<u8> {
    (0..OBJECT).map(|i| (i * 7 % 251) as u8).collect()
}

/// A request's `Range`: `bytes=A-B` or `bytes=A-` (`From`), or
/// `bytes=-N`, the last N bytes (`Suffix`).
#[derive(Clone, Copy)]
enum Range {
    From(usize, Option<usize>),
    Suffix(usize),
}

impl Range {
    /// Its first and last byte in an object of `total` bytes (the first
    /// is `total` or more if it starts past the end).
    fn within(self, total: usize) -> (usize, usize) {
        match self {
            Range::From(a, b) => (a, b.map_or(total - 1, |b| b.min(total - 1))),
            Range::Suffix(n) => (total.saturating_sub(n), total - 1),
        }
    }
}

/// How the server answers its `n`-th request, for `range` of the object at
/// `path`.
type Answer = dyn Fn(usize, &str, Range, &mut TcpStream) + Send + Sync;

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
        let mut range = Range::From(0, None);
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line
            .split(' ')
            .nth(1)
            .unwrap_or("/")
            .trim_start_matches('/');
        let path = path.to_owned();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
            if let Some(r) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                range = match r.trim().split_once('-').unwrap() {
                    ("", n) => Range::Suffix(n.parse().unwrap()),
                    (a, b) => Range::From(a.parse().unwrap(), b.parse().ok()),
                };
            }
        }
        answer(
            count.fetch_add(1, Ordering::SeqCst),
            &path,
            range,
            &mut stream,
        );
    }
}

/// A `206` for `range` of `bytes`, claiming they are `total` bytes (zeros
/// past their end), or a `416` if it starts past `total`.
fn partial(stream: &mut TcpStream, bytes: &[u8], range: Range, total: usize) {
    let (a, b) = range.within(total);
    let head = match a < total {
        true => format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{total}\r\nContent-Length: {}\r\n\r\n",
            b + 1 - a
        ),
        false => format!(
            "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{total}\r\nContent-Length: 0\r\n\r\n"
        ),
    };
    let _ = stream.write_all(head.as_bytes());
    let body = (a..=b)
        .filter(|_| a < total)
        .map(|i| bytes.get(i).copied().unwrap_or(0));
    let _ = stream.write_all(&body.collect::<Vec<u8>>());
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
        |_, _: &str, range: Range, stream: &mut TcpStream| {
            let (a, b) = range.within(OBJECT);
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
    let url = serve(Arc::new(|n, _: &str, range, stream: &mut TcpStream| {
        let total = if n == 0 { 4096 } else { OBJECT };
        partial(stream, &contents(), range, total)
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
        |_, _: &str, range: Range, stream: &mut TcpStream| {
            let (a, b) = range.within(TOTAL);
            if a >= TOTAL {
                let head = format!(
                "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{TOTAL}\r\nContent-Length: 0\r\n\r\n"
            );
                let _ = stream.write_all(head.as_bytes());
                return;
            }
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

/// An image published in a new directory, served on 127.0.0.1 by a
/// server that says the manifest is 8 MiB longer than it is (past its
/// first chunk, so that no read of it tells the truth) in the answers for
/// which `lie` (given the request's number) is true; its trusted digest.
fn lying_about_the_manifest(
    lie: impl Fn(usize) -> bool + Send + Sync + 'static,
) -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let (src, image) = (dir.path().join("src"), dir.path().join("image"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("hello"), b"hello world\n").unwrap();
    let published = publish(&src, &image, &MerkleTreeParams::default()).unwrap();
    let url = serve(Arc::new(
        move |n, path: &str, range, stream: &mut TcpStream| {
            let bytes = std::fs::read(image.join(path)).unwrap_or_default();
            let extra = match path == MANIFEST_NAME && lie(n) {
                true => 8 << 20,
                false => 0,
            };
            partial(stream, &bytes, range, bytes.len() + extra)
        },
    ));
    (dir, url, format!("sha256:{}", published.digest))
}

/// Opens the manifest of the image at `url` trusted by `digest`, keeping
/// what is fetched in `cache` if given.
fn open_image(url: &str, digest: &str, cache: Option<&Path>) -> verityfs::Result<()> {
    let store = match cache {
        Some(cache) => store(url).with_cache(cache, 1 << 30, Some(digest)).unwrap(),
        None => store(url),
    };
    let trust = ManifestTrust::Digest(digest.parse().unwrap());
    let verifier = Verifier::new(ReadOptions::default());
    open_manifest(&verifier, store.open(MANIFEST_NAME).unwrap(), &trust).map(drop)
}

#[test]
fn a_manifest_size_lied_about_once_does_not_fail_later_mounts_from_the_cache() {
    let lie = Arc::new(AtomicBool::new(true));
    let (dir, url, digest) = {
        let lie = lie.clone();
        lying_about_the_manifest(move |_| lie.load(Ordering::SeqCst))
    };
    let cache = dir.path().join("cache");
    assert!(
        open_image(&url, &digest, Some(&cache)).is_err(),
        "mounted through the lie"
    );
    lie.store(false, Ordering::SeqCst);
    // The size the liar claimed is in the cache's records now: it is
    // dropped at the first read it fails, and the mount goes on.
    for attempt in 1..=2 {
        let mounted = open_image(&url, &digest, Some(&cache));
        assert!(
            mounted.is_ok(),
            "mount {attempt} after the lie: {mounted:?}"
        );
    }
}

#[test]
fn a_manifest_size_lied_about_in_a_first_answer_is_asked_again() {
    let (_dir, url, digest) = lying_about_the_manifest(|n| n == 0);
    let mounted = open_image(&url, &digest, None);
    assert!(mounted.is_ok(), "{mounted:?}");
}

#[test]
fn a_lock_held_on_a_map_of_the_cache_does_not_hang_reads() {
    let url = serve(Arc::new(|_, _: &str, range, stream: &mut TcpStream| {
        partial(stream, &contents(), range, OBJECT)
    }));
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let hex = "ab".repeat(32);
    let store = store(&url).with_cache(&cache, 1 << 30, None).unwrap();
    let object = store.open(&format!("objects/sha256-{hex}")).unwrap();
    // Another process of the cache's owner (a second mount of it, stopped
    // at the wrong moment) holds the object's map locked, for good.
    let map = std::fs::File::open(cache.join(format!("objects-sha256-{hex}.map"))).unwrap();
    rustix::fs::flock(&map, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for _ in 0..2 {
            let mut buf = [0u8; 4096];
            let read = object.read_exact_at(&mut buf, 0).map(|()| buf);
            let _ = done.send(read.map_err(|e| e.to_string()));
        }
    });
    for n in 0..2 {
        let read = finished.recv_timeout(Duration::from_secs(10));
        let read = read.unwrap_or_else(|_| panic!("read {n} hung while the map was locked"));
        assert_eq!(read.unwrap()[..], contents()[..4096], "read {n}");
    }
}

/// The bytes the files of `dir` take, and those of its removed files this
/// process still holds open.
fn disk_usage(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let listed = std::fs::read_dir(dir).unwrap().flatten();
    let listed = listed.map(|e| e.metadata().unwrap().blocks() * 512).sum();
    let removed = std::fs::read_dir("/proc/self/fd").unwrap().flatten();
    let removed = removed
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|l| l.starts_with(dir) && l.to_string_lossy().ends_with(" (deleted)"))
        })
        .filter_map(|e| std::fs::metadata(e.path()).ok());
    (listed, removed.map(|m| m.blocks() * 512).sum())
}

#[test]
fn the_disk_cache_keeps_to_its_limit_while_objects_it_dropped_are_read() {
    const SIZE: usize = 3 << 20;
    const MAX: u64 = 4 << 20;
    let names: Vec<String> = (0..6)
        .map(|i| format!("objects/sha256-{i:02x}{}", "ab".repeat(31)))
        .collect();
    let url = {
        let names = names.clone();
        serve(Arc::new(
            move |_, path: &str, range, stream: &mut TcpStream| {
                let i = names.iter().position(|n| n == path).unwrap_or(0);
                let bytes: Vec<u8> = (0..SIZE).map(|b| (b * (i + 3) % 251) as u8).collect();
                partial(stream, &bytes, range, SIZE)
            },
        ))
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let store = store(&url).with_cache(&cache, MAX, None).unwrap();
    // Every object stays open while the others push it out of the cache.
    let objects: Vec<_> = names.iter().map(|n| store.open(n).unwrap()).collect();
    for half in 0..2 {
        for object in &objects {
            let mut buf = vec![0u8; SIZE / 2];
            object
                .read_exact_at(&mut buf, (half * SIZE / 2) as u64)
                .unwrap();
        }
    }
    let (listed, removed) = disk_usage(&cache);
    assert!(
        listed + removed <= MAX,
        "the cache takes {listed} bytes in its files and {removed} in removed files still \
         open: over its limit of {MAX}"
    );
}

#[test]
fn a_range_ending_at_the_largest_offset_fails_the_read_without_a_panic() {
    // `bytes 0-18446744073709551615/...`: one past its last byte does not
    // fit in 64 bits. A panic in a task of the store's runtime is caught
    // there: the hook sees it (and leaves other tests' panics alone).
    let panics = Arc::new(AtomicUsize::new(0));
    let counted = panics.clone();
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info
            .location()
            .is_some_and(|l| l.file().contains("object_store"))
        {
            counted.fetch_add(1, Ordering::SeqCst);
        }
        report(info);
    }));
    let url = serve(Arc::new(|_, _: &str, _, stream: &mut TcpStream| {
        let head = format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-{}/{OBJECT}\r\nContent-Length: {OBJECT}\r\n\r\n",
            u64::MAX
        );
        let _ = stream.write_all(head.as_bytes());
        let _ = stream.write_all(&contents());
    }));
    let object = store(&url).open("object").unwrap();
    let mut buf = [0u8; 4096];
    let read = object.read_exact_at(&mut buf, 0);
    let _ = std::panic::take_hook();
    let error = read.expect_err("a range that does not fit was taken");
    assert_eq!(
        panics.load(Ordering::SeqCst),
        0,
        "panicked; the read said: {error}"
    );
    assert!(error.to_string().contains("Content-Range"), "{error}");
}
