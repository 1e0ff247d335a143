//! Images over HTTP end to end: `verityfs publish` a tree, serve it with a
//! real nginx, directly or through the fault-injecting proxy of
//! verityfs-testnet, and mount its URL with the real `verityfs` binary
//! (real FUSE mounts). What the mount serves must equal the source; the
//! requests it makes are read back from nginx's access log; faults (a
//! server down, stalled, cutting or corrupting its responses) must give
//! `EIO` in bounded time or the right bytes, never wrong bytes, and leave
//! the mount serving once cleared; the disk cache must serve a remount
//! without the network; the daemon's memory must stay bounded while a
//! large file streams through it.
//!
//! Every read runs on a thread of its own under a watchdog, and every
//! mount is unmounted (its daemon killed if need be) when its guard is
//! dropped: no test can hang.

mod common;

use std::fs::{self, File};
use std::io::{self, Read};
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::images::*;
use common::*;
use verityfs_testnet::{Faults, Nginx, Proxy, Request};

/// The big file's size: several of the store's chunks, not a multiple of
/// the block size.
const BIG_SIZE: usize = 9_000_000;
/// The block size of the images' trees.
const BLOCK: u64 = 4096;
/// The remote store's chunk: the most one request of a stream asks for.
const CHUNK: u64 = 2 << 20;
/// Objects start their tree at a multiple of this (docs/IMAGE.md).
const TREE_ALIGN: u64 = 65536;
/// The fault tests' `--timeout`.
const TIMEOUT: &str = "--timeout=3";
/// How long a read failing because of a fault may take: the timeout,
/// and two seconds.
const EIO_BOUND: Duration = Duration::from_secs(3 + 2);
/// How long any read may take before the test fails as hung.
const READ_LIMIT: Duration = Duration::from_secs(60);
/// Where the image's objects are on the servers: faults apply to them
/// only, so that mounting (which reads the manifest) is not disturbed.
const OBJECTS: &str = "/image/objects/";

/// The published test tree, served by a private nginx at `/image`.
struct Served {
    image: Image,
    nginx: Nginx,
}

impl Served {
    /// The tree with a file `big` of `big_size` bytes.
    fn new(big_size: usize) -> Served {
        let image = Image::publish(big_size);
        let nginx = Nginx::serve(image.image.parent().unwrap()).unwrap();
        Served { image, nginx }
    }

    /// Mounts the image from the server at `base` (`http://HOST:PORT/`).
    fn mount(&self, base: &str, args: &[&str]) -> Mount {
        self.image
            .mount_from(&PathBuf::from(format!("{base}image")), args)
    }

    /// Every request nginx has logged, once its log stops growing: nginx
    /// logs a request after its response is sent, so the last one answered
    /// may not be there yet.
    fn requests(&self) -> Vec<Request> {
        let mut logged = self.nginx.requests().unwrap();
        for _ in 0..40 {
            thread::sleep(Duration::from_millis(50));
            let now = self.nginx.requests().unwrap();
            if now.len() == logged.len() {
                break;
            }
            logged = now;
        }
        logged
    }

    /// The contents of source file `name`.
    fn source(&self, name: &str) -> Vec<u8> {
        fs::read(self.image.src.join(name)).unwrap()
    }

    /// The path on the server of the object of source file `name`.
    fn object_uri(&self, name: &str) -> String {
        format!("{OBJECTS}sha256-{}", self.image.object_hex(name))
    }
}

/// A read's result and how long it took.
type Timed<T> = (io::Result<T>, Duration);

/// Runs `read` on a thread of its own under a watchdog, timed.
fn timed<T: Send + 'static>(
    what: &str,
    read: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> Timed<T> {
    let start = Instant::now();
    let result = with_watchdog(what, READ_LIMIT, read);
    (result, start.elapsed())
}

/// Opens `path` (for an image's file, its object is checked then).
fn open(path: &Path) -> Timed<Arc<File>> {
    let path = path.to_owned();
    timed("open", move || File::open(path).map(Arc::new))
}

/// `len` bytes at `offset` of an open file.
fn read_file_at(file: &Arc<File>, offset: u64, len: usize) -> Timed<Vec<u8>> {
    let file = file.clone();
    timed("pread", move || {
        let mut buf = vec![0; len];
        file.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    })
}

/// All of `path`, opened and read from its start.
fn read_all(path: &Path) -> Timed<Vec<u8>> {
    let path = path.to_owned();
    timed("read", move || fs::read(path))
}

/// Asserts that a read gave `expected`.
#[track_caller]
fn assert_bytes(read: Timed<Vec<u8>>, expected: &[u8], what: &str) -> Duration {
    match read {
        (Ok(bytes), took) => {
            assert!(bytes == expected, "{what}: wrong bytes");
            took
        }
        (Err(e), _) => panic!("{what}: {e}"),
    }
}

/// Asserts that a read failed with `EIO`.
#[track_caller]
fn assert_eio<T>(read: Timed<T>, what: &str) -> Duration {
    let (result, took) = read;
    // Not the bytes read, if any: only that there were some.
    assert_errno(result.map(|_| "data"), libc::EIO, what);
    took
}

/// Asserts that a read failed with `EIO` within [`EIO_BOUND`].
#[track_caller]
fn assert_eio_in_time<T>(read: Timed<T>, what: &str) -> Duration {
    let took = assert_eio(read, what);
    assert!(took < EIO_BOUND, "{what}: EIO after {took:?}");
    took
}

/// Asserts that a read gave `expected` or failed with `EIO`, never other
/// bytes; says which.
#[track_caller]
fn assert_right_or_eio(read: Timed<Vec<u8>>, expected: &[u8], what: &str) -> String {
    match read {
        (Ok(bytes), took) => {
            assert!(bytes == expected, "{what}: wrong bytes");
            format!("right bytes in {took:?}")
        }
        (Err(e), took) => {
            assert_eq!(e.raw_os_error(), Some(libc::EIO), "{what}: {e}");
            format!("EIO in {took:?}")
        }
    }
}

/// `faults` applied to the objects only.
fn on_objects(faults: Faults) -> Faults {
    Faults {
        only_path_containing: Some(OBJECTS.into()),
        ..faults
    }
}

/// The mount lists the source tree (from the manifest in memory: it does
/// not need the server).
#[track_caller]
fn assert_lists_the_source(mount: &Mount, served: &Served) {
    let mnt = mount.mnt.clone();
    let listed = with_watchdog("listing", READ_LIMIT, move || listing(&mnt));
    assert_eq!(listed, listing(&served.image.src));
}

/// The bytes `first..last+1` a request's `Range: bytes=...` header asks
/// for, of an object of `size` bytes.
fn range_of(request: &Request, size: u64) -> Range<u64> {
    let spec = request
        .range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="));
    let (first, last) = spec
        .and_then(|s| s.split_once('-'))
        .unwrap_or_else(|| panic!("not a single range: {request:?}"));
    let number = |s: &str| -> u64 { s.parse().unwrap_or_else(|_| panic!("{request:?}")) };
    match (first, last) {
        ("", suffix) => size.saturating_sub(number(suffix))..size,
        (first, "") => number(first)..size,
        (first, last) => number(first)..(number(last) + 1).min(size),
    }
}

/// Where the big file's blocks are read in the request tests: `first`,
/// more than a chunk from the start (a read at the start is a stream, read
/// ahead), and `far`, two chunks further or more and before the chunk
/// holding the tree (fetched whole, with data, when the file is opened).
fn random_blocks(seed: u64) -> (u64, u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let blocks = CHUNK / BLOCK;
    let first = rng.u64(blocks + 16..2 * blocks) * BLOCK;
    let tree_chunk = (BIG_SIZE as u64).next_multiple_of(TREE_ALIGN) / CHUNK * CHUNK;
    let far = rng.u64((first + 2 * CHUNK) / BLOCK..tree_chunk / BLOCK) * BLOCK;
    (first, far)
}

/// A block of `data` at `offset`.
fn block(data: &[u8], offset: u64) -> &[u8] {
    &data[offset as usize..][..BLOCK as usize]
}

#[test]
fn a_mount_over_http_serves_the_published_tree() {
    let served = Served::new(BIG_SIZE);
    let mount = served.mount(&served.nginx.url(), &[]);
    assert_lists_the_source(&mount, &served);
    let source = listing(&served.image.src);
    assert_eq!(source.len(), 14, "{source:#?}");
    for name in regular_files(&source) {
        let (path, original) = (mount.mnt.join(name), served.image.src.join(name));
        let what = format!("{name:?}");
        assert_bytes(read_all(&path), &fs::read(&original).unwrap(), &what);
        assert_eq!(measure(&path), digest(&original, &[]), "{name:?}");
    }

    // A wrong digest: refused, nothing mounted.
    let last = served.image.digest.chars().last().unwrap();
    let flipped = if last == '0' { '1' } else { '0' };
    let digest = &served.image.digest;
    let wrong = format!("{}{flipped}", &digest[..digest.len() - 1]);
    let mnt = tempfile::tempdir().unwrap();
    let out = run(Command::new(VERITYFS)
        .arg("mount")
        .arg(format!("{}image", served.nginx.url()))
        .arg(mnt.path())
        .arg(format!("--digest={wrong}")));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("does not match --digest"), "{stderr}");
    assert!(!is_mounted(mnt.path()));
}

#[test]
fn a_cold_stream_asks_for_ranges_of_a_chunk_at_most() {
    let served = Served::new(BIG_SIZE);
    let mount = served.mount(&served.nginx.url(), &[]);
    let mounting = served.requests().len();
    let took = assert_bytes(
        read_all(&mount.path("big")),
        &served.source("big"),
        "the big file",
    );
    let mut requests = served.requests();
    for r in &requests {
        assert_eq!((&r.method[..], r.status), ("GET", 206), "{r:?}");
    }
    let reading = requests.split_off(mounting);
    let uri = served.object_uri("big");
    let size = fs::metadata(served.image.object_of("big")).unwrap().len();
    let ranges: Vec<Range<u64>> = reading
        .iter()
        .map(|r| {
            assert_eq!(r.uri, uri, "{r:?}");
            let range = range_of(r, size);
            assert!(range.end - range.start <= CHUNK, "{r:?}");
            assert_eq!(r.body_bytes_sent, range.end - range.start, "{r:?}");
            range
        })
        .collect();
    // The kernel splits a large read into reads of 1 MiB sent together,
    // which the daemon may take in any order: one taken before the reads
    // ahead of it looks random and is fetched exactly, besides the chunk
    // holding it. A byte may so be fetched twice, not more.
    let mut bounds: Vec<u64> = ranges.iter().flat_map(|r| [r.start, r.end]).collect();
    bounds.sort_unstable();
    bounds.dedup();
    let mut twice = 0;
    for piece in bounds.windows(2) {
        let times = ranges
            .iter()
            .filter(|r| r.start <= piece[0] && piece[1] <= r.end)
            .count();
        assert!(times <= 2, "{piece:?} fetched {times} times: {ranges:?}");
        twice += if times == 2 { piece[1] - piece[0] } else { 0 };
    }
    let fetched: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    println!(
        "mounting: {mounting} range requests; a cold read of {BIG_SIZE} bytes in {took:?}: \
         {} range requests (all 206) of {fetched} bytes of the {size}-byte object \
         ({twice} bytes fetched twice)",
        reading.len()
    );
}

#[test]
fn a_cold_random_block_costs_one_request_of_one_block() {
    let served = Served::new(BIG_SIZE);
    let mount = served.mount(&served.nginx.url(), &[]);
    let big = served.source("big");
    let (first, far) = random_blocks(1);
    let file = open(&mount.path("big")).0.unwrap();
    let opening = served.requests().len();
    assert_bytes(
        read_file_at(&file, first, 4096),
        block(&big, first),
        "first",
    );
    let warm = served.requests().len();
    assert_bytes(read_file_at(&file, far, 4096), block(&big, far), "far");
    let requests = served.requests().split_off(warm);
    let [request] = &requests[..] else {
        panic!("a random block at {far}: {requests:#?}");
    };
    let size = fs::metadata(served.image.object_of("big")).unwrap().len();
    assert_eq!(range_of(request, size), far..far + BLOCK, "{request:?}");
    assert_eq!(request.status, 206, "{request:?}");
    println!(
        "mount and open: {opening} requests; first block at {first}: {} requests; \
         a block {} bytes further: 1 request ({:?})",
        warm - opening,
        far - first,
        request.range
    );
}

#[test]
fn a_server_down_fails_reads_in_time_and_the_mount_serves_again() {
    let served = Served::new(BIG_SIZE);
    let proxy = Proxy::start(served.nginx.addr()).unwrap();
    let big = served.source("big");
    let (a, _) = random_blocks(2);
    // A new daemon (nothing in memory) with the big file open.
    let mount_and_open = |proxy: &Proxy| {
        let mount = served.mount(&proxy.url(), &[TIMEOUT]);
        let file = open(&mount.path("big")).0.unwrap();
        (mount, file)
    };
    let fails_in_time = |mount: &Mount, file: &Arc<File>, down: &str| {
        let read = assert_eio_in_time(read_file_at(file, a, 4096), down);
        let opened = assert_eio_in_time(open(&mount.path("a/run.sh")), down);
        assert_lists_the_source(mount, &served);
        format!("{down}: read {read:?}, open {opened:?}")
    };
    let serves_again = |mount: &Mount, file: &Arc<File>, what: &str| {
        assert_bytes(read_file_at(file, a, 4096), block(&big, a), what);
        let small = read_all(&mount.path("a/run.sh"));
        assert_bytes(small, &served.source("a/run.sh"), what);
        assert_bytes(read_all(&mount.path("big")), &big, what);
    };

    let (mount, file) = mount_and_open(&proxy);
    proxy.set(on_objects(Faults {
        status: Some(503),
        ..Faults::default()
    }));
    let status = fails_in_time(&mount, &file, "503");
    proxy.set(Faults::default());
    serves_again(&mount, &file, "after 503");
    drop((file, mount));

    let (mount, file) = mount_and_open(&proxy);
    let addr = proxy.addr();
    drop(proxy);
    let closed = fails_in_time(&mount, &file, "port closed");
    let _proxy = Proxy::start_on(addr, served.nginx.addr()).unwrap();
    serves_again(&mount, &file, "port open again");
    println!("EIO after: {status}; {closed}");
}

#[test]
fn a_stalled_server_fails_reads_in_time() {
    let served = Served::new(BIG_SIZE);
    let proxy = Proxy::start(served.nginx.addr()).unwrap();
    let mount = served.mount(&proxy.url(), &[TIMEOUT]);
    let big = served.source("big");
    let (a, _) = random_blocks(3);
    let file = open(&mount.path("big")).0.unwrap();

    proxy.set(on_objects(Faults {
        stall: true,
        ..Faults::default()
    }));
    let read = assert_eio_in_time(read_file_at(&file, a, 4096), "a read, stalled");
    let stream = assert_eio_in_time(read_all(&mount.path("big")), "a stream, stalled");
    let opened = assert_eio_in_time(open(&mount.path("a/run.sh")), "an open, stalled");
    assert_lists_the_source(&mount, &served);
    proxy.set(Faults::default());
    assert_bytes(read_file_at(&file, a, 4096), block(&big, a), "released");
    assert_bytes(read_all(&mount.path("big")), &big, "all, released");
    println!("EIO after: read {read:?}, stream {stream:?}, open {opened:?}");
}

/// A server whose error answers carry a page of any size: the daemon
/// keeps only its start, in memory and in its log, at mount time and for
/// the reads of a mount.
#[test]
fn an_error_page_of_any_size_is_neither_held_nor_logged_whole() {
    const PAGE: u64 = 256 << 20;
    const MORE_KIB: u64 = 64 << 10;
    const LOGGED: usize = 64 << 10;
    let served = Served::new(1 << 20);
    let proxy = Proxy::start(served.nginx.addr()).unwrap();
    let mount = served.mount(&proxy.url(), &[TIMEOUT]);
    let peak_kib = || peak_rss_kib(mount.daemon_pid().as_raw_nonzero().get());
    let before = peak_kib();
    proxy.set(on_objects(Faults {
        status: Some(404),
        status_body: PAGE,
        ..Faults::default()
    }));
    let (opened, took) = open(&mount.path("big"));
    assert_eq!(opened.err().and_then(|e| e.raw_os_error()), Some(libc::EIO));
    let (after, log) = (peak_kib(), mount.log());
    assert!(
        after < before + MORE_KIB,
        "the daemon's peak RSS grew from {before} to {after} KiB"
    );
    assert!(log.len() < LOGGED, "{} bytes logged", log.len());
    assert!(log.contains("404"), "{log}");

    proxy.set(Faults {
        status: Some(404),
        status_body: PAGE,
        ..Faults::default()
    });
    let stderr = mount_fails_from(&served, &proxy.url(), &[TIMEOUT]);
    assert!(stderr.len() < LOGGED, "{} bytes printed", stderr.len());
    assert!(stderr.contains("404"), "{stderr}");
    println!(
        "a 404 with a {} MiB page: open failed in {took:?}, the daemon's peak RSS \
         {before} -> {after} KiB, {} bytes logged; a failed mount printed {} bytes",
        PAGE >> 20,
        log.len(),
        stderr.len()
    );
}

/// The `--timeout` of the tests of many calls waiting on a stalled server:
/// long enough that they still wait while the rest of the mount is used.
const LONG_TIMEOUT: u64 = 20;
/// How long the manifest's answers (lookups, listings) and a read of
/// another file may take while those calls wait.
const PROMPT: Duration = Duration::from_secs(3);

/// Calls running at once, each on a thread of its own, timed.
type Calls<T> = Vec<std::thread::JoinHandle<Timed<T>>>;

/// Runs `n` calls of `call` (given 0 to `n - 1`) at once, each on a
/// thread of its own, timed.
fn at_once<T: Send + 'static>(
    n: u64,
    call: impl Fn(u64) -> io::Result<T> + Send + Sync + 'static,
) -> Calls<T> {
    let call = Arc::new(call);
    (0..n)
        .map(|i| {
            let call = call.clone();
            std::thread::spawn(move || {
                let start = Instant::now();
                (call(i), start.elapsed())
            })
        })
        .collect()
}

/// Waits until a request has reached the server after the first `before`,
/// then a second more, for the others to reach the daemon.
fn wait_for_the_server(proxy: &Proxy, before: u64) {
    let start = Instant::now();
    while proxy.requests() == before {
        assert!(start.elapsed() < READ_LIMIT, "no call reached the server");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_secs(1));
}

/// Asserts that every call of `calls` is still waiting, then that each
/// fails with `EIO` within the timeout and five seconds; the fastest and
/// slowest.
#[track_caller]
fn assert_wait_then_eio<T: Send + 'static>(calls: Calls<T>, what: &str) -> (Duration, Duration) {
    let waiting = calls.iter().filter(|c| !c.is_finished()).count();
    assert_eq!(waiting, calls.len(), "{what}: some ended already");
    let limit = Duration::from_secs(LONG_TIMEOUT + 5);
    let ended = with_watchdog(what, limit + PROMPT, move || {
        calls
            .into_iter()
            .map(|c| c.join().unwrap())
            .collect::<Vec<_>>()
    });
    let took: Vec<Duration> = ended
        .into_iter()
        .map(|call| assert_eio(call, what))
        .collect();
    let (fastest, slowest) = (*took.iter().min().unwrap(), *took.iter().max().unwrap());
    assert!(slowest < limit, "{what}: EIO after {slowest:?}");
    (fastest, slowest)
}

/// Asserts that the mount lists the source tree within [`PROMPT`]; how
/// long it took.
#[track_caller]
fn assert_lists_promptly(mount: &Mount, served: &Served, what: &str) -> Duration {
    let start = Instant::now();
    let mnt = mount.mnt.clone();
    let listed = with_watchdog(what, PROMPT, move || listing(&mnt));
    assert_eq!(listed, listing(&served.image.src));
    start.elapsed()
}

/// Reads of `big` by `readers` threads at once, waiting: the file is
/// opened (its tree fetched) with O_DIRECT, so that each read reaches the
/// daemon, then its object stalled, then the threads each read a block
/// `step` bytes after the last, before the chunk holding the tree (which
/// the open fetched). Returns when a read has reached the server.
fn read_big_stalled(
    served: &Served,
    proxy: &Proxy,
    mount: &Mount,
    readers: u64,
) -> (Arc<File>, Calls<()>, u64) {
    let path = mount.path("big");
    let direct = move || {
        let mut options = File::options();
        options.read(true).custom_flags(libc::O_DIRECT).open(path)
    };
    let file = Arc::new(with_watchdog("open", READ_LIMIT, direct).unwrap());
    proxy.set(Faults {
        stall: true,
        only_path_containing: Some(served.object_uri("big")),
        ..Faults::default()
    });
    let before = proxy.requests();
    let tree_chunk = (BIG_SIZE as u64).next_multiple_of(TREE_ALIGN) / CHUNK * CHUNK;
    let step = tree_chunk / readers / BLOCK * BLOCK;
    let stalled = file.clone();
    let reads = at_once(readers, move |i| {
        let mut buf = vec![0; BLOCK as usize];
        stalled.read_exact_at(&mut buf, i * step)
    });
    wait_for_the_server(proxy, before);
    (file, reads, step)
}

#[test]
fn readers_waiting_on_a_stalled_file_leave_the_rest_of_the_mount_serving() {
    const READERS: u64 = 64;
    let served = Served::new(BIG_SIZE);
    let proxy = Proxy::start(served.nginx.addr()).unwrap();
    let mount = served.mount(&proxy.url(), &[&format!("--timeout={LONG_TIMEOUT}")]);
    let big = served.source("big");
    // Nothing else is looked up before the stall, so that the listing
    // below reaches the daemon too, not the kernel's caches.
    let (file, readers, step) = read_big_stalled(&served, &proxy, &mount, READERS);

    let listed = assert_lists_promptly(&mount, &served, "a listing while reads wait");
    let small = mount.path("a/run.sh");
    let start = Instant::now();
    let other = with_watchdog("another file while reads wait", PROMPT, move || {
        fs::read(small)
    });
    let source = served.source("a/run.sh");
    let other = assert_bytes((other, start.elapsed()), &source, "a/run.sh");
    let (fastest, slowest) = assert_wait_then_eio(readers, "a read of the stalled file");

    proxy.set(Faults::default());
    let mut block = vec![0; BLOCK as usize];
    file.read_exact_at(&mut block, step).unwrap();
    assert!(
        block[..] == big[step as usize..][..BLOCK as usize],
        "released"
    );
    assert_bytes(read_all(&mount.path("big")), &big, "all, released");
    println!(
        "{READERS} reads of a stalled file waiting: the tree listed in {listed:?}, another \
         file read in {other:?}; the reads failed with EIO after {fastest:?} to {slowest:?} \
         (--timeout={LONG_TIMEOUT})"
    );
}

#[test]
fn first_opens_waiting_on_a_stalled_server_leave_the_tree_listed() {
    const OPENERS: u64 = 16;
    let served = Served::new(BIG_SIZE);
    let proxy = Proxy::start(served.nginx.addr()).unwrap();
    let mount = served.mount(&proxy.url(), &[&format!("--timeout={LONG_TIMEOUT}")]);
    proxy.set(on_objects(Faults {
        stall: true,
        ..Faults::default()
    }));
    let before = proxy.requests();
    // Each open of a file not open yet fetches its tree.
    let path = mount.path("big");
    let openers = at_once(OPENERS, move |_| File::open(&path));
    wait_for_the_server(&proxy, before);

    let listed = assert_lists_promptly(&mount, &served, "a listing while opens wait");
    let (fastest, slowest) = assert_wait_then_eio(openers, "an open, stalled");
    proxy.set(Faults::default());
    assert_bytes(
        read_all(&mount.path("big")),
        &served.source("big"),
        "released",
    );
    println!(
        "{OPENERS} first opens waiting on a stalled server: the tree listed in {listed:?}; \
         the opens failed with EIO after {fastest:?} to {slowest:?} (--timeout={LONG_TIMEOUT})"
    );
}

#[test]
fn a_connection_aborted_while_reads_wait_ends_the_daemon_at_once() {
    const READERS: u64 = 16;
    let served = Served::new(BIG_SIZE);
    let proxy = Proxy::start(served.nginx.addr()).unwrap();
    let mut mount = served.mount(&proxy.url(), &[&format!("--timeout={LONG_TIMEOUT}")]);
    let (file, readers, _) = read_big_stalled(&served, &proxy, &mount, READERS);
    // A forced unmount aborts a FUSE mount's connection first (then fails,
    // busy: files are open).
    let forced = run(Command::new("umount").arg("-f").arg(&mount.mnt));
    // The waiting reads fail at once, and the daemon ends without waiting
    // for the reads it was serving (each until its timeout).
    let ended = with_watchdog("the aborted reads", PROMPT, move || {
        readers
            .into_iter()
            .map(|r| r.join().unwrap())
            .collect::<Vec<_>>()
    });
    for (result, _) in ended {
        assert!(result.is_err(), "a read of an aborted connection");
    }
    drop(file);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = mount.daemon_exited() {
            break status;
        }
        assert!(start.elapsed() < PROMPT, "the daemon waited for its reads");
        std::thread::sleep(Duration::from_millis(10));
    };
    let log = mount.log();
    assert!(!log.contains("panicked"), "{log}");
    println!(
        "{READERS} reads waiting, the connection aborted ({}): the daemon ended ({status}) \
         in {:?}:\n{log}",
        String::from_utf8_lossy(&forced.stderr).trim(),
        start.elapsed()
    );
}

#[test]
fn cut_responses_give_the_right_bytes_or_eio() {
    let served = Served::new(BIG_SIZE);
    let proxy = Proxy::start(served.nginx.addr()).unwrap();
    let big = served.source("big");
    let (_, far) = random_blocks(4);
    let cuts = [0, 1000, 1 << 20].into_iter().flat_map(|at| {
        [
            Faults {
                truncate_after: Some(at),
                ..Faults::default()
            },
            Faults {
                reset_after: Some(at),
                ..Faults::default()
            },
        ]
    });
    for faults in cuts {
        // A new daemon: nothing in memory.
        let mount = served.mount(&proxy.url(), &[TIMEOUT]);
        let file = open(&mount.path("big")).0.unwrap();
        proxy.set(on_objects(faults.clone()));
        let what = format!("{faults:?}");
        let stream = assert_right_or_eio(read_all(&mount.path("big")), &big, &what);
        let random = read_file_at(&file, far, 4096);
        let random = assert_right_or_eio(random, block(&big, far), &what);
        proxy.set(Faults::default());
        assert_bytes(read_all(&mount.path("big")), &big, "cleared");
        println!(
            "truncate {:?}, reset {:?}: stream: {stream}; random block: {random}",
            faults.truncate_after, faults.reset_after
        );
    }
}

#[test]
fn flipped_bytes_give_eio_and_are_not_sticky() {
    let served = Served::new(BIG_SIZE);
    let proxy = Proxy::start(served.nginx.addr()).unwrap();
    let big = served.source("big");
    let (first, far) = random_blocks(5);
    let flip_at = |at: u64| {
        on_objects(Faults {
            flip_byte_at: Some(at),
            ..Faults::default()
        })
    };

    // Data: a random block (fetched exactly), a stream (in chunks). The
    // kernel tries a failed read again, and the second try may fetch a
    // range starting elsewhere (a whole chunk, if it looks sequential):
    // a block at the start of a chunk has its byte 100 flipped either way.
    let mount = served.mount(&proxy.url(), &[TIMEOUT]);
    let file = open(&mount.path("big")).0.unwrap();
    assert_bytes(
        read_file_at(&file, first, 4096),
        block(&big, first),
        "first",
    );
    let far = far / CHUNK * CHUNK;
    proxy.set(flip_at(100));
    assert_eio(read_file_at(&file, far, 4096), "a block");
    assert_eio(read_all(&mount.path("big")), "a stream");
    proxy.set(Faults::default());
    assert_bytes(read_file_at(&file, far, 4096), block(&big, far), "a block");
    assert_bytes(read_all(&mount.path("big")), &big, "a stream");
    drop((file, mount));

    // A small file's descriptor (a byte of its root hash): the file is
    // fetched whole at its open.
    let mount = served.mount(&proxy.url(), &[TIMEOUT]);
    let small = "a/run.sh";
    let descriptor = (served.source(small).len() as u64).next_multiple_of(TREE_ALIGN);
    proxy.set(flip_at(descriptor + 20));
    assert_eio(read_all(&mount.path(small)), "a descriptor");
    // Its version byte: no longer a descriptor at all, tampering too.
    proxy.set(flip_at(descriptor));
    assert_eio(read_all(&mount.path(small)), "a garbled descriptor");
    proxy.set(Faults::default());
    assert_bytes(read_all(&mount.path(small)), &served.source(small), "small");

    // The big file's tree, fetched in the chunk holding it at its open.
    let tree = (BIG_SIZE as u64).next_multiple_of(TREE_ALIGN);
    proxy.set(flip_at(tree % CHUNK + 100));
    assert_eio(read_all(&mount.path("big")), "the tree");
    proxy.set(Faults::default());
    assert_bytes(read_all(&mount.path("big")), &big, "the tree");
}

#[test]
fn the_disk_cache_serves_a_remount_without_the_network() {
    let served = Served::new(BIG_SIZE);
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = format!("--cache-dir={}", cache.path().join("cache").display());
    let url = served.nginx.url();
    let source = listing(&served.image.src);
    let read_everything = |mount: &Mount| {
        assert_lists_the_source(mount, &served);
        for name in regular_files(&source) {
            let original = fs::read(served.image.src.join(name)).unwrap();
            assert_bytes(read_all(&mount.mnt.join(name)), &original, "file");
        }
    };

    let mut mount = served.mount(&url, &[&cache_dir]);
    read_everything(&mount);
    mount.unmount();
    let first = served.requests().len();
    let mut mount = served.mount(&url, &[&cache_dir]);
    read_everything(&mount);
    mount.unmount();
    let again = served.requests().len() - first;
    assert_eq!(again, 0, "requests for a cached image");

    // A damaged block in the cache: fetched again from the server.
    let cached = cache
        .path()
        .join("cache")
        .join(format!("objects-sha256-{}", served.image.object_hex("big")));
    flip_byte(&cached, 5000);
    let mut mount = served.mount(&url, &[&cache_dir]);
    let big = served.source("big");
    assert_bytes(read_all(&mount.path("big")), &big, "a damaged cache");
    mount.unmount();
    let refetched = served.requests().len() - first;
    assert!(refetched >= 1, "the damaged block was not fetched again");

    // Offline.
    let Served { image, nginx } = served;
    drop(nginx);
    let mount = image.mount_from(&PathBuf::from(format!("{url}image")), &[&cache_dir]);
    let mnt = mount.mnt.clone();
    let listed = with_watchdog("listing", READ_LIMIT, move || listing(&mnt));
    assert_eq!(listed, source);
    for name in regular_files(&source) {
        let original = fs::read(image.src.join(name)).unwrap();
        assert_bytes(read_all(&mount.mnt.join(name)), &original, "offline");
    }
    println!(
        "first mount: {first} requests; remount: 0; a damaged cached block: \
         {refetched} requests; offline: every file read"
    );
}

/// `verityfs mount` of the image with `args`, which must fail: its
/// stderr. A mount that appears instead is taken down (its daemon killed,
/// then lazily unmounted) before the test fails.
fn mount_fails(served: &Served, args: &[&str]) -> String {
    mount_fails_from(served, &served.nginx.url(), args)
}

/// [`mount_fails`] from the server at `base` (`http://HOST:PORT/`).
fn mount_fails_from(served: &Served, base: &str, args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let (mnt, log) = (dir.path().join("mnt"), dir.path().join("log"));
    fs::create_dir(&mnt).unwrap();
    let out = File::create(&log).unwrap();
    let mut daemon = Spawned::new(
        Command::new(VERITYFS)
            .arg("mount")
            .arg(format!("{base}image"))
            .arg(&mnt)
            .arg(format!("--digest={}", served.image.digest))
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out),
    );
    let status = wait_for(&mut daemon.0, MOUNT_TIMEOUT);
    let stderr = fs::read_to_string(&log).unwrap();
    if status.is_none() {
        drop(daemon);
        run(Command::new("umount").arg("-l").arg(&mnt));
        panic!("mounted with {args:?}: {stderr}");
    }
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{stderr}");
    assert!(!is_mounted(&mnt));
    stderr
}

#[test]
fn a_cache_dir_of_another_user_or_writable_by_others_is_refused_at_mount() {
    let served = Served::new(1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let theirs = dir.path().join("theirs");
    fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).unwrap();
    let stderr = mount_fails(&served, &[&format!("--cache-dir={}", theirs.display())]);
    let want = format!(
        "cache directory {}: belongs to uid {NOBODY}, not to uid 0 who mounts",
        theirs.display()
    );
    assert!(stderr.contains(&want), "{stderr}");

    let open = dir.path().join("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let stderr = mount_fails(&served, &[&format!("--cache-dir={}", open.display())]);
    let want = format!(
        "cache directory {}: writable by other users (mode 1777)",
        open.display()
    );
    assert!(stderr.contains(&want), "{stderr}");
    assert_eq!(fs::read_dir(&theirs).unwrap().count(), 0);
    assert_eq!(fs::read_dir(&open).unwrap().count(), 0);
    println!("refused: {}", stderr.trim_end());
}

/// A user who owns a directory on the way cannot send root's cache into
/// a directory of root's through a link of theirs (the directory made
/// there would belong to root and pass the checks).
#[test]
fn a_cache_dir_through_another_user_s_symlink_is_refused_at_mount() {
    let served = Served::new(1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let (victim, attacker) = (dir.path().join("victim"), dir.path().join("attacker"));
    fs::create_dir(&victim).unwrap();
    fs::create_dir(&attacker).unwrap();
    std::os::unix::fs::chown(&attacker, Some(NOBODY), Some(NOBODY)).unwrap();
    let link = attacker.join("link");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(NOBODY), Some(NOBODY)).unwrap();
    let cache = link.join("cache");
    let stderr = mount_fails(&served, &[&format!("--cache-dir={}", cache.display())]);
    let want = format!(
        "cache directory '{}': '{}' is a symbolic link of uid {NOBODY}, not followed",
        cache.display(),
        link.display()
    );
    assert!(stderr.contains(&want), "{stderr}");
    assert_eq!(fs::read_dir(&victim).unwrap().count(), 0);
}

#[test]
fn files_the_cache_did_not_make_are_neither_written_nor_dropped() {
    let served = Served::new(1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    fs::create_dir(&cache).unwrap();
    // Root's files elsewhere, hard linked into the cache under the names of
    // the big file's bytes and of a small file's map.
    let small = "a/run.sh";
    let planted = [
        (
            "data",
            format!("objects-sha256-{}", served.image.object_hex("big")),
        ),
        (
            "map",
            format!("objects-sha256-{}.map", served.image.object_hex(small)),
        ),
    ];
    let then = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_500_000_000);
    for (file, name) in &planted {
        let path = dir.path().join(file);
        fs::write(&path, format!("root's {file}, not the cache's")).unwrap();
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(then)
            .unwrap();
        fs::hard_link(&path, cache.join(name)).unwrap();
    }
    // A web root's files, and a pair named as the cache's but not made by it.
    let mut magic_first = b"vfscach1".to_vec();
    magic_first.extend_from_slice(&[0xff; 100]);
    let zeros = format!("objects-sha256-{}", "0".repeat(64));
    let unrelated: Vec<(String, Vec<u8>)> = vec![
        ("app.js".into(), vec![b'x'; 200_000]),
        ("app.js.map".into(), magic_first),
        (zeros.clone(), vec![b'y'; 200_000]),
        (format!("{zeros}.map"), b"{}".to_vec()),
    ];
    for (name, data) in &unrelated {
        fs::write(cache.join(name), data).unwrap();
    }

    // A cache smaller than two small files' objects: every new object
    // drops older ones.
    let args = [
        &format!("--cache-dir={}", cache.display())[..],
        "--cache-max=100K",
    ];
    let mut mount = served.mount(&served.nginx.url(), &args);
    let source = listing(&served.image.src);
    let files: Vec<&Path> = regular_files(&source).collect();
    for name in &files {
        let original = fs::read(served.image.src.join(name)).unwrap();
        assert_bytes(read_all(&mount.mnt.join(name)), &original, "a file");
    }
    mount.unmount();
    let big_uri = served.object_uri("big");
    let fetched = |uri: &str| served.requests().iter().filter(|r| r.uri == uri).count();
    assert!(
        fetched(&big_uri) > 0,
        "the big file was not read from the network"
    );
    for (file, name) in &planted {
        let path = dir.path().join(file);
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            format!("root's {file}, not the cache's"),
            "{name}"
        );
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.modified().unwrap(), then, "{name}");
        assert_eq!(meta.nlink(), 2, "{name}");
        let why = format!("{name} in the cache directory has other links");
        assert!(mount.log().contains(&why), "{}", mount.log());
    }
    for (name, data) in &unrelated {
        assert!(fs::read(cache.join(name)).unwrap() == *data, "{name}");
    }
    // Eviction ran: not every small file's object is still there.
    let kept = fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".map"))
        .filter(|n| !unrelated.iter().any(|(u, _)| u == n) && !planted.iter().any(|(_, p)| p == n))
        .count();
    let small_files = files.len() - 1;
    assert!(
        kept < small_files,
        "{kept} maps kept of {small_files} small files"
    );

    // Another mount reads everything again, the big file from the network.
    let before = fetched(&big_uri);
    let mount = served.mount(&served.nginx.url(), &args);
    let big = served.source("big");
    assert_bytes(read_all(&mount.path("big")), &big, "the big file again");
    assert!(fetched(&big_uri) > before);
    println!(
        "planted hard links left alone (content, mtime, links) and their files read from \
         the network; {} unrelated files kept; {kept} maps kept of {small_files} small files",
        unrelated.len()
    );
}

#[test]
fn memory_stays_bounded_while_a_large_file_streams() {
    const SIZE: usize = 128 << 20;
    const PIECE: usize = 1 << 20;
    const BOUND_KIB: u64 = 300 << 10;
    let served = Served::new(SIZE);
    let mount = served.mount(&served.nginx.url(), &[]);
    let pid = mount.daemon_pid().as_raw_nonzero().get();
    let before = peak_rss_kib(pid);
    let (mnt, src) = (mount.path("big"), served.image.src.join("big"));
    let (checked, took) = timed("stream", move || {
        let (mut served, mut original) = (File::open(mnt)?, File::open(src)?);
        let (mut a, mut b) = (vec![0; PIECE], vec![0; PIECE]);
        for _ in 0..SIZE / PIECE {
            served.read_exact(&mut a)?;
            original.read_exact(&mut b)?;
            if a != b {
                return Ok(false);
            }
        }
        Ok(true)
    });
    assert!(checked.unwrap(), "wrong bytes");
    let peak = peak_rss_kib(pid);
    assert!(peak < BOUND_KIB, "peak RSS {peak} KiB");
    println!(
        "streaming {} MiB in {took:?}: the daemon's peak RSS {} MiB (before: {} MiB)",
        SIZE >> 20,
        peak >> 10,
        before >> 10
    );
}

/// The peak resident memory of process `pid` so far, in KiB.
fn peak_rss_kib(pid: i32) -> u64 {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .unwrap_or_else(|| panic!("no VmHWM in {text}"));
    line.trim().trim_end_matches("kB").trim().parse().unwrap()
}
