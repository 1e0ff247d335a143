//! The workloads and the ways each one reads its files: the plain copy
//! directly, the plain copy through the mount, the verity copy through the
//! mount (and, for the sequential read, hashing tools and the library's
//! verified read as further anchors). Every cold measurement starts after
//! dropping the caches, on a fresh mount, so that the daemon's tree cache is
//! cold too.

use std::path::{Path, PathBuf};
use std::time::Duration;

use verityfs::Snapshot;

use super::files::{self, TestFiles, PLAIN_DIR, SMALL_FILE_SIZE, VERITY_DIR};
use super::hogs::Hogs;
use super::measure::{
    cold, cold_after, measured, median, open_random, peak_rss_kib, random_reads, read_library,
    read_sequential, read_whole, run_tool, Device, Measured, CAT_CHUNK, RANDOM_READ_SIZE,
};
use super::mount::Mount;
use super::{check_interrupted, Result};

/// CPU hogs running during the busy-machine workload.
pub const HOGS: usize = 2;

/// A workload, in report order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Workload {
    /// Many small files, each read whole, one after another.
    Small,
    /// Random 4 KiB reads in the large file.
    Random,
    /// A sequential read of the large file.
    Seq,
    /// 4 readers in parallel, each reading its own file.
    Parallel4,
    /// 16 readers in parallel, each reading its own file.
    Parallel16,
    /// 4 readers in parallel, all reading the large file.
    ParallelSame4,
    /// The sequential read while CPU hogs run.
    Busy,
    /// The sequential read again, with the page cache warm.
    Warm,
}

/// The names `--workload` takes, each selecting one or more workloads.
pub const GROUPS: &[&str] = &["small", "random", "seq", "parallel", "busy", "warm"];

impl Workload {
    /// Every workload, in report order.
    pub const ALL: [Workload; 8] = [
        Workload::Small,
        Workload::Random,
        Workload::Seq,
        Workload::Parallel4,
        Workload::Parallel16,
        Workload::ParallelSame4,
        Workload::Busy,
        Workload::Warm,
    ];

    /// Its JSON key.
    pub fn key(self) -> &'static str {
        match self {
            Workload::Small => "small",
            Workload::Random => "random",
            Workload::Seq => "seq",
            Workload::Parallel4 => "parallel4",
            Workload::Parallel16 => "parallel16",
            Workload::ParallelSame4 => "parallel_same4",
            Workload::Busy => "busy",
            Workload::Warm => "warm",
        }
    }

    /// The `--workload` name that selects it.
    fn group(self) -> &'static str {
        match self {
            Workload::Parallel4 | Workload::Parallel16 | Workload::ParallelSame4 => "parallel",
            other => other.key(),
        }
    }

    /// Its short name in the chart.
    pub fn short(self) -> &'static str {
        match self {
            Workload::Small => "small files",
            Workload::Random => "random 4 KiB",
            Workload::Seq => "sequential",
            Workload::Parallel4 => "4 streams",
            Workload::Parallel16 => "16 streams",
            Workload::ParallelSame4 => "4 on one file",
            Workload::Busy => "busy CPUs",
            Workload::Warm => "warm reread",
        }
    }

    /// The workloads a comma-separated `--workload` list selects (`all`
    /// for every one), in report order; `None` for an unknown name.
    pub fn parse_list(text: &str) -> Option<Vec<Workload>> {
        let names: Vec<&str> = text.split(',').map(str::trim).collect();
        if names.iter().any(|n| *n != "all" && !GROUPS.contains(n)) {
            return None;
        }
        let all = names.contains(&"all");
        Some(
            Workload::ALL
                .into_iter()
                .filter(|w| all || names.contains(&w.group()))
                .collect(),
        )
    }

    /// What it does, with the sizes.
    pub fn title(self, sizes: &files::Sizes, reads: usize) -> String {
        let mb = |bytes: u64| format!("{:.0} MB", bytes as f64 / 1e6);
        let large = mb(sizes.large);
        match self {
            Workload::Small => format!(
                "small files: {} files of {} KiB, each read whole, one after another",
                sizes.files,
                SMALL_FILE_SIZE >> 10
            ),
            Workload::Random => format!(
                "random reads: {reads} reads of {} KiB at seeded offsets in a {large} file",
                RANDOM_READ_SIZE >> 10
            ),
            Workload::Seq => format!("sequential read of a {large} file"),
            Workload::Parallel4 | Workload::Parallel16 => format!(
                "{} parallel readers, each reading its own {} file",
                self.streams(),
                mb(sizes.stream)
            ),
            Workload::ParallelSame4 => format!("4 parallel readers of the same {large} file"),
            Workload::Busy => format!(
                "sequential read of a {large} file while {HOGS} processes keep the CPUs busy"
            ),
            Workload::Warm => format!("sequential reread of a {large} file, page cache warm"),
        }
    }

    /// The ways it reads its files, in table order.
    pub fn variants(self) -> &'static [Variant] {
        use Variant::*;
        match self {
            Workload::Seq => &[
                PlainDirect,
                Sha256sum,
                Openssl,
                PlainMount,
                VerityMount,
                VerityLibrary,
            ],
            _ => &[PlainDirect, PlainMount, VerityMount],
        }
    }

    /// Whether it runs with cold caches.
    pub fn cold(self) -> bool {
        self != Workload::Warm
    }

    /// Number of parallel readers of the stream workloads.
    fn streams(self) -> usize {
        match self {
            Workload::Parallel16 => files::STREAMS,
            _ => 4,
        }
    }

    /// The bytes one measurement reads.
    pub fn bytes(self, sizes: &files::Sizes, reads: usize) -> u64 {
        match self {
            Workload::Small => sizes.files as u64 * SMALL_FILE_SIZE,
            Workload::Random => reads as u64 * RANDOM_READ_SIZE,
            Workload::Seq | Workload::Busy | Workload::Warm => sizes.large,
            Workload::Parallel4 | Workload::Parallel16 => self.streams() as u64 * sizes.stream,
            Workload::ParallelSame4 => 4 * sizes.large,
        }
    }
}

/// A way of reading a workload's files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Variant {
    /// The plain copy, read directly in the backing directory.
    PlainDirect,
    /// coreutils `sha256sum` of the plain copy.
    Sha256sum,
    /// `openssl dgst -sha256` of the plain copy.
    Openssl,
    /// The plain copy read through the mount.
    PlainMount,
    /// The verity copy read through the mount.
    VerityMount,
    /// The verity copy read by the library (`VerityFile::read_at`), no FUSE.
    VerityLibrary,
}

impl Variant {
    /// Its JSON key.
    pub fn key(self) -> &'static str {
        match self {
            Variant::PlainDirect => "plain_direct",
            Variant::Sha256sum => "sha256sum",
            Variant::Openssl => "openssl_dgst_sha256",
            Variant::PlainMount => "plain_mount",
            Variant::VerityMount => "verity_mount",
            Variant::VerityLibrary => "verity_library",
        }
    }

    /// Its label in the table and the chart.
    pub fn label(self) -> &'static str {
        match self {
            Variant::PlainDirect => "plain file, read directly",
            Variant::Sha256sum => "sha256sum of the plain file",
            Variant::Openssl => "openssl dgst -sha256 of the plain file",
            Variant::PlainMount => "plain file through the mount",
            Variant::VerityMount => "verity file through the mount",
            Variant::VerityLibrary => "verity file, library read (no FUSE)",
        }
    }
}

/// Latencies of single reads, µs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Latency {
    /// The median.
    pub median_us: f64,
    /// The mean.
    pub mean_us: f64,
    /// The 99th percentile.
    pub p99_us: f64,
}

impl Latency {
    fn of(latencies: &[Duration]) -> Latency {
        let mut us: Vec<f64> = latencies.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        us.sort_by(f64::total_cmp);
        let p99 = us
            .len()
            .checked_sub(1)
            .map_or(f64::NAN, |last| us[(last * 99).div_ceil(100)]);
        Latency {
            mean_us: us.iter().sum::<f64>() / us.len() as f64,
            p99_us: p99,
            median_us: median(us),
        }
    }
}

/// One measurement of a workload read one way.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Bytes the workload read.
    pub bytes: u64,
    /// Device read requests meanwhile.
    pub device_read_requests: u64,
    /// 512-byte sectors the device read meanwhile.
    pub device_read_sectors: u64,
    /// Bytes our processes (this one, the tools, the daemon) read from
    /// storage meanwhile.
    pub own_read_bytes: u64,
    /// Per-read latencies (random reads).
    pub latency: Option<Latency>,
    /// The daemon's peak RSS in KiB (reads through the mount).
    pub daemon_peak_rss_kib: Option<u64>,
    /// The daemon's CPU time in seconds during the workload (reads through
    /// the mount): on a shared machine, steadier than the wall-clock time.
    pub daemon_cpu_seconds: Option<f64>,
    /// The whole machine's CPU time in seconds during the workload.
    pub machine_cpu_seconds: f64,
    /// The file's read path counters (library reads).
    pub tree: Option<Snapshot>,
}

impl Sample {
    fn new(bytes: u64, m: Measured) -> Sample {
        Sample {
            seconds: m.elapsed.as_secs_f64(),
            bytes,
            device_read_requests: m.read_requests,
            device_read_sectors: m.read_sectors,
            own_read_bytes: m.own_read_bytes,
            daemon_cpu_seconds: m.daemon_cpu.map(|c| c.as_secs_f64()),
            machine_cpu_seconds: m.machine_cpu.as_secs_f64(),
            ..Sample::default()
        }
    }
}

/// What one workload's reads returned.
struct Done {
    bytes: u64,
    latencies: Option<Vec<Duration>>,
}

impl Done {
    fn bytes(bytes: u64) -> Done {
        Done {
            bytes,
            latencies: None,
        }
    }
}

/// What the measurements run on.
pub struct Bench<'a> {
    /// The test files.
    pub files: &'a TestFiles,
    /// Where the mounts go.
    pub mountpoint: &'a Path,
    /// The device whose requests are counted.
    pub device: &'a Device,
    /// The offsets of the random reads.
    pub offsets: Vec<u64>,
}

impl Bench<'_> {
    /// Measures `workload` read the `variant` way.
    pub fn measure(&self, workload: Workload, variant: Variant) -> Result<Sample> {
        check_interrupted()?;
        match variant {
            Variant::PlainDirect => self.read(workload, &self.files.plain(), None),
            Variant::PlainMount | Variant::VerityMount => {
                let mount = Mount::start(&self.files.backing, self.mountpoint)?;
                let dir = match variant {
                    Variant::PlainMount => PLAIN_DIR,
                    _ => VERITY_DIR,
                };
                let mut sample = self.read(workload, &mount.path(dir), mount.pid())?;
                sample.daemon_peak_rss_kib = mount.pid().and_then(peak_rss_kib);
                mount.stop()?;
                Ok(sample)
            }
            Variant::Sha256sum => self.tool("sha256sum", &[]),
            Variant::Openssl => self.tool("openssl", &["dgst", "-sha256"]),
            Variant::VerityLibrary => self.library(),
        }
    }

    /// Runs `workload` on the files in `root`, cold (or warm, after a first
    /// read), with the hogs of the busy workload around it.
    fn read(&self, workload: Workload, root: &Path, daemon: Option<u32>) -> Result<Sample> {
        let _hogs = match workload {
            Workload::Busy => Some(Hogs::start(HOGS)?),
            _ => None,
        };
        let work = || self.work(workload, root);
        let (done, m) = if workload.cold() {
            cold(self.device, daemon, work)?
        } else {
            work()?;
            measured(self.device, daemon, work)?
        };
        self.check(workload, root, done.bytes)?;
        let mut sample = Sample::new(done.bytes, m);
        sample.latency = done.latencies.as_deref().map(Latency::of);
        Ok(sample)
    }

    /// The reads of `workload` on the files in `root`.
    fn work(&self, workload: Workload, root: &Path) -> Result<Done> {
        match workload {
            Workload::Small => {
                let mut buf = vec![0u8; CAT_CHUNK];
                let mut total = 0;
                for i in 0..self.files.sizes.files {
                    total += read_whole(&files::small(root, i), &mut buf)?;
                }
                Ok(Done::bytes(total))
            }
            Workload::Random => {
                let file = open_random(&files::large(root))?;
                let latencies = random_reads(&file, &self.offsets)?;
                Ok(Done {
                    bytes: latencies.len() as u64 * RANDOM_READ_SIZE,
                    latencies: Some(latencies),
                })
            }
            Workload::Seq | Workload::Busy | Workload::Warm => {
                read_sequential(&files::large(root), CAT_CHUNK).map(Done::bytes)
            }
            Workload::Parallel4 | Workload::Parallel16 => {
                let paths = (0..workload.streams()).map(|i| files::stream(root, i));
                parallel(paths.collect()).map(Done::bytes)
            }
            Workload::ParallelSame4 => parallel(vec![files::large(root); 4]).map(Done::bytes),
        }
    }

    /// Checks that `workload` read all it should have.
    fn check(&self, workload: Workload, root: &Path, got: u64) -> Result<()> {
        let want = workload.bytes(&self.files.sizes, self.offsets.len());
        if got == want {
            Ok(())
        } else {
            Err(format!(
                "{}: read {got} bytes in '{}', expected {want}",
                workload.key(),
                root.display()
            ))
        }
    }

    /// Hashes the large plain file with a tool, cold.
    fn tool(&self, program: &str, args: &[&str]) -> Result<Sample> {
        let hash = |file: &Path| {
            let mut all: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
            all.push(file.as_os_str());
            run_tool(program, &all)
        };
        let warm_up = || hash(Path::new("/dev/null"));
        let large = files::large(&self.files.plain());
        let ((), m) = cold_after(self.device, None, warm_up, || hash(&large))?;
        Ok(Sample::new(self.files.sizes.large, m))
    }

    /// Reads the large verity file through the library, cold.
    fn library(&self) -> Result<Sample> {
        let path = files::large(&self.files.verity());
        let (read, m) = cold(self.device, None, || read_library(&path, true))?;
        self.check(Workload::Seq, &self.files.verity(), read.bytes)?;
        Ok(Sample {
            tree: Some(read.stats),
            ..Sample::new(read.bytes, m)
        })
    }
}

/// Reads every file of `paths` whole, each in a thread of its own, all at
/// once; returns the bytes read.
fn parallel(paths: Vec<PathBuf>) -> Result<u64> {
    std::thread::scope(|scope| {
        let readers: Vec<_> = paths
            .iter()
            .map(|path| scope.spawn(move || read_sequential(path, CAT_CHUNK)))
            .collect();
        readers
            .into_iter()
            .map(|reader| reader.join().expect("reader thread panicked"))
            .sum()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_lists() {
        assert_eq!(Workload::parse_list("all"), Some(Workload::ALL.to_vec()));
        assert_eq!(
            Workload::parse_list("warm,small"),
            Some(vec![Workload::Small, Workload::Warm])
        );
        assert_eq!(
            Workload::parse_list("parallel"),
            Some(vec![
                Workload::Parallel4,
                Workload::Parallel16,
                Workload::ParallelSame4
            ])
        );
        assert_eq!(Workload::parse_list("seq,bogus"), None);
        assert_eq!(Workload::parse_list(""), None);
    }

    #[test]
    fn latencies() {
        let l = Latency::of(&[1, 2, 3, 10].map(Duration::from_micros));
        assert_eq!((l.median_us, l.mean_us, l.p99_us), (2.5, 4.0, 10.0));
    }
}
