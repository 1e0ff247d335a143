//! Remote image mounts against their anchors, in one run: a private nginx
//! serves published images through a proxy adding a round-trip latency
//! (20 ms), and each figure is compared with what `curl` gets from the same
//! server through the same proxy.
//!
//! `cargo bench -p verityfs-cli --bench remote` measures (256 MiB file,
//! 10,000-file image, three sequential runs); under `cargo test` (no
//! `--bench` argument) the same steps run once on small inputs without the
//! latency, so that the benchmark itself stays working.
//!
//! Figures: cold sequential throughput through the mount against one
//! `curl` GET of the object, the share of requests that fetched the tree,
//! and the CPU time the whole machine spent on each; the mount and listing time of the large image; the requests per
//! cold random 4 KiB read once the tree is in; the requests of a reread
//! from a warm `--cache-dir`. Results go to stdout and to
//! `target/remote-bench.json`. `VERITYFS_BENCH_LATENCY_MS` sets another
//! latency (0: the cost of the network path alone).

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use verityfs_testnet::{Faults, Nginx, Proxy, Request};

const VERITYFS: &str = env!("CARGO_BIN_EXE_verityfs");

/// The sizes of one run: the benchmark's, or the smoke test's.
struct Plan {
    big: usize,
    files: usize,
    random_reads: usize,
    runs: usize,
    latency: Duration,
}

const BENCH: Plan = Plan {
    big: 256 << 20,
    files: 10_000,
    random_reads: 200,
    runs: 3,
    latency: Duration::from_millis(20),
};

const SMOKE: Plan = Plan {
    big: 8 << 20,
    files: 100,
    random_reads: 10,
    runs: 1,
    latency: Duration::ZERO,
};

fn main() {
    let mut plan = match std::env::args().any(|a| a == "--bench") {
        true => BENCH,
        false => SMOKE,
    };
    // Another latency, to see how it weighs: VERITYFS_BENCH_LATENCY_MS=0.
    if let Ok(ms) = std::env::var("VERITYFS_BENCH_LATENCY_MS") {
        plan.latency = Duration::from_millis(ms.parse().expect("a number of milliseconds"));
    }
    let work = tempfile::Builder::new()
        .prefix("verityfs-remote-bench")
        .tempdir_in("/var/tmp")
        .expect("a scratch directory in /var/tmp");
    let bench = Bench::prepare(work.path(), &plan);
    let mut report = Vec::new();
    for run in 1..=plan.runs {
        report.push(bench.sequential(run));
    }
    report.push(bench.listing(plan.files));
    report.push(bench.random(plan.random_reads));
    report.push(bench.warm_cache());
    let json = format!("[\n  {}\n]\n", report.join(",\n  "));
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../remote-bench.json");
    fs::write(&out, json).expect("write the report");
    println!("report: {}", out.display());
}

/// The published images, the servers, and where mounts go.
struct Bench {
    work: PathBuf,
    nginx: Nginx,
    proxy: Proxy,
    /// The big image's digest, its one object's path and data size.
    big: (String, String, u64),
    /// The many-files image's digest.
    many: String,
}

impl Bench {
    fn prepare(work: &Path, plan: &Plan) -> Bench {
        let root = work.join("www");
        let big_src = work.join("big-src");
        fs::create_dir_all(&big_src).unwrap();
        let mut data = vec![0u8; plan.big];
        fastrand::Rng::with_seed(7).fill(&mut data);
        fs::write(big_src.join("big"), &data).unwrap();
        drop(data);
        let big_digest = publish(&big_src, &root.join("big"));
        let file_digest = run(Command::new(VERITYFS)
            .arg("digest")
            .arg(big_src.join("big")));
        let object = format!(
            "big/objects/{}",
            file_digest
                .split_whitespace()
                .next()
                .unwrap()
                .replace(':', "-")
        );
        let many_src = work.join("many-src");
        for i in 0..plan.files {
            let dir = many_src.join(format!("d{}", i % 100));
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join(format!("f{i}")), i.to_string()).unwrap();
        }
        let many = publish(&many_src, &root.join("many"));
        let nginx = Nginx::serve(&root).expect("nginx");
        let proxy = Proxy::start(nginx.addr()).expect("proxy");
        proxy.set(Faults {
            latency: plan.latency,
            ..Faults::default()
        });
        Bench {
            work: work.to_owned(),
            nginx,
            proxy,
            big: (big_digest, object, plan.big as u64),
            many,
        }
    }

    fn requests(&self) -> Vec<Request> {
        self.nginx.requests().expect("nginx's access log")
    }

    /// A cold sequential read through a new mount, against `curl`.
    fn sequential(&self, run: usize) -> String {
        let (digest, object, size) = &self.big;
        let url = format!("{}{object}", self.proxy.url());
        let (curl, curl_cpu) = machine_cpu(|| {
            timed(|| {
                let range = format!("0-{}", size - 1);
                run_quiet(Command::new("curl").args([
                    "-sf",
                    "-o",
                    "/dev/null",
                    "-r",
                    &range,
                    &url,
                ]));
            })
        });
        let before = self.requests().len();
        let mount = Mount::new(self, "big", digest, &[]);
        let (read, read_cpu) = machine_cpu(|| timed(|| read_all(&mount.path.join("big"))));
        drop(mount);
        let requests = &self.requests()[before..];
        let objects: Vec<_> = requests
            .iter()
            .filter(|r| r.uri.contains("/objects/"))
            .collect();
        let tree = objects.iter().filter(|r| range_start(r) >= *size).count();
        let mbps = |t: Duration| *size as f64 / t.as_secs_f64() / 1e6;
        println!(
            "sequential run {run}: mount {:.0} MB/s, curl {:.0} MB/s ({:.2}x); {} requests, {} for the tree ({:.2}%); \
             CPU of the whole machine: mount {read_cpu:.2} s, curl {curl_cpu:.2} s",
            mbps(read),
            mbps(curl),
            curl.as_secs_f64() / read.as_secs_f64(),
            objects.len(),
            tree,
            100.0 * tree as f64 / objects.len() as f64
        );
        format!(
            r#"{{"workload": "sequential", "run": {run}, "bytes": {size}, "mount_s": {:.4}, "curl_s": {:.4}, "mount_cpu_s": {read_cpu:.3}, "curl_cpu_s": {curl_cpu:.3}, "requests": {}, "tree_requests": {tree}}}"#,
            read.as_secs_f64(),
            curl.as_secs_f64(),
            objects.len()
        )
    }

    /// Mounting the many-files image and listing it.
    fn listing(&self, files: usize) -> String {
        let manifest = format!("{}many/manifest", self.proxy.url());
        let fetch =
            timed(|| run_quiet(Command::new("curl").args(["-sf", "-o", "/dev/null", &manifest])));
        let (mount, mounted) = timed_value(|| Mount::new(self, "many", &self.many, &[]));
        let (list, listed) = timed_value(|| run(Command::new("ls").arg("-lR").arg(&mount.path)));
        drop(mount);
        let entries = list.lines().filter(|l| l.starts_with('-')).count();
        assert_eq!(entries, files, "every file listed");
        println!(
            "listing {files} files: mounted in {:.3} s (the manifest alone: {:.3} s), ls -lR {:.3} s",
            mounted.as_secs_f64(),
            fetch.as_secs_f64(),
            listed.as_secs_f64()
        );
        format!(
            r#"{{"workload": "listing", "files": {files}, "mount_s": {:.4}, "manifest_curl_s": {:.4}, "ls_s": {:.4}}}"#,
            mounted.as_secs_f64(),
            fetch.as_secs_f64(),
            listed.as_secs_f64()
        )
    }

    /// Random 4 KiB reads in a new mount, once the tree is in.
    fn random(&self, reads: usize) -> String {
        let (digest, _, size) = &self.big;
        let mount = Mount::new(self, "big", digest, &[]);
        let file = File::open(mount.path.join("big")).unwrap();
        let mut block = [0u8; 4096];
        file.read_exact_at(&mut block, 0).unwrap();
        let before = self.requests().len();
        let mut rng = fastrand::Rng::with_seed(11);
        let blocks = size / 4096;
        let elapsed = timed(|| {
            for _ in 0..reads {
                file.read_exact_at(&mut block, rng.u64(1..blocks) * 4096)
                    .unwrap();
            }
        });
        drop(file);
        drop(mount);
        let requests = self.requests().len() - before;
        let per_read = requests as f64 / reads as f64;
        let latency = elapsed.as_secs_f64() * 1e3 / reads as f64;
        println!("random 4 KiB reads: {per_read:.2} requests each, {latency:.1} ms each");
        format!(
            r#"{{"workload": "random", "reads": {reads}, "requests": {requests}, "ms_per_read": {latency:.3}}}"#
        )
    }

    /// A full read with a new `--cache-dir`, then a reread after a remount.
    fn warm_cache(&self) -> String {
        let (digest, _, _) = &self.big;
        let cache = self.work.join("cache");
        let option = format!("--cache-dir={}", cache.display());
        let mount = Mount::new(self, "big", digest, &[&option]);
        read_all(&mount.path.join("big"));
        drop(mount);
        let before = self.requests().len();
        let mount = Mount::new(self, "big", digest, &[&option]);
        let reread = timed(|| read_all(&mount.path.join("big")));
        drop(mount);
        let requests = self.requests().len() - before;
        println!(
            "warm-cache reread: {requests} requests, {:.3} s",
            reread.as_secs_f64()
        );
        format!(
            r#"{{"workload": "warm-cache", "requests": {requests}, "reread_s": {:.4}}}"#,
            reread.as_secs_f64()
        )
    }
}

/// A mount of an image of the bench, unmounted when dropped.
struct Mount {
    path: PathBuf,
    child: Child,
}

impl Mount {
    fn new(bench: &Bench, image: &str, digest: &str, options: &[&str]) -> Mount {
        let path = bench.work.join("mnt");
        fs::create_dir_all(&path).unwrap();
        let url = format!("{}{image}", bench.proxy.url());
        let child = Command::new(VERITYFS)
            .args(["mount", &url])
            .arg(&path)
            .arg(format!("--digest={digest}"))
            .args(options)
            .stdin(Stdio::null())
            .spawn()
            .expect("start verityfs mount");
        let mut mount = Mount { path, child };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !is_mounted(&mount.path) {
            assert!(
                mount.child.try_wait().unwrap().is_none(),
                "the mount exited"
            );
            assert!(Instant::now() < deadline, "the mount did not come up");
            std::thread::sleep(Duration::from_millis(2));
        }
        mount
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
        let _ = self.child.wait();
    }
}

fn is_mounted(path: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let path = path.to_str().unwrap();
    info.lines().any(|l| l.split(' ').nth(4) == Some(path))
}

/// `verityfs publish SRC DEST`: the digest it prints.
fn publish(src: &Path, dest: &Path) -> String {
    run(Command::new(VERITYFS).arg("publish").arg(src).arg(dest))
        .trim()
        .to_owned()
}

fn read_all(path: &Path) {
    let mut file = File::open(path).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    while file.read(&mut buf).unwrap() > 0 {}
}

fn range_start(request: &Request) -> u64 {
    let range = request.range.as_deref().unwrap_or("bytes=0-");
    let from = range
        .trim_start_matches("bytes=")
        .split('-')
        .next()
        .unwrap_or("0");
    from.parse().unwrap_or(0)
}

/// `f`'s value and the CPU seconds the whole machine spent (every
/// process: the reader, the daemon, the proxy, nginx) while it ran.
fn machine_cpu<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let busy = || {
        let stat = fs::read_to_string("/proc/stat").unwrap();
        let cpu = stat.lines().next().unwrap().split_whitespace().skip(1);
        let ticks: Vec<u64> = cpu.map(|t| t.parse().unwrap()).collect();
        // user, nice, system, irq, softirq, steal: not idle nor iowait.
        let busy: u64 = [0, 1, 2, 5, 6, 7].iter().map(|&i| ticks[i]).sum();
        busy as f64 / 100.0
    };
    let before = busy();
    let value = f();
    (value, busy() - before)
}

fn timed(f: impl FnOnce()) -> Duration {
    timed_value(f).1
}

fn timed_value<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let value = f();
    (value, start.elapsed())
}

/// Runs `cmd`, which must succeed; its standard output.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (is it installed? scripts/test.sh installs it)"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn run_quiet(cmd: &mut Command) {
    run(cmd);
}
