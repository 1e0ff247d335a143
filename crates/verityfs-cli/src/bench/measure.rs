//! The measuring instruments: dropping caches, the device's read counters,
//! timed readers (a `cat`-like loop, external tools, the library's verified
//! read, random 4 KiB reads) and the daemon's peak memory.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use verityfs::Snapshot;
use verityfs::{ReadOptions, Verifier, VerityFile};

use super::{check_interrupted, Context, Result};

/// Buffer size of the sequential reader: what coreutils' `cat` uses.
pub const CAT_CHUNK: usize = 128 << 10;
/// Read size of the library-level sequential read: the size of the requests
/// the kernel sends the daemon on a sequential stream through the mount.
pub const LIBRARY_CHUNK: usize = 1 << 20;
/// Size of one random read.
pub const RANDOM_READ_SIZE: u64 = 4096;
/// Seed of the random offsets (the same offsets for every file and run).
pub const RANDOM_SEED: u64 = 0x7665_7269_7479_6673;

/// Whether we run as root (dropping caches needs it).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Writes dirty data back and empties the page cache, dentries and inodes:
/// `sync; echo 3 > /proc/sys/vm/drop_caches`.
pub fn drop_caches() -> Result<()> {
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3").ctx("writing /proc/sys/vm/drop_caches")
}

/// The block device holding a directory (the whole disk if the filesystem
/// is on a partition), whose `/sys/block/<dev>/stat` counts the requests.
#[derive(Clone, Debug)]
pub struct Device {
    /// Its kernel name (`vda`, `nvme0n1`).
    pub name: String,
    stat: PathBuf,
}

/// Cumulative counters of a device (fields 1 and 3 of its `stat` file).
#[derive(Clone, Copy, Debug, Default)]
pub struct DeviceCounters {
    /// Read requests completed.
    pub read_requests: u64,
    /// 512-byte sectors read.
    pub read_sectors: u64,
}

impl Device {
    /// The device of the filesystem holding `path`: its `st_dev` as
    /// `/sys/dev/block/MAJ:MIN`, moved up to the disk if that is a partition.
    pub fn of(path: &Path) -> Result<Device> {
        let dev = std::fs::metadata(path)
            .ctx(format!("can't stat '{}'", path.display()))?
            .dev();
        let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
        let link = format!("/sys/dev/block/{major}:{minor}");
        let mut sys = std::fs::canonicalize(&link).map_err(|_| {
            format!(
                "'{}' is not on a block device ({major}:{minor} has no {link}); \
                 device request counts need one: use --dir on a disk-backed filesystem",
                path.display()
            )
        })?;
        if sys.join("partition").exists() {
            sys.pop();
        }
        let name = sys
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| format!("unexpected sysfs path {}", sys.display()))?;
        let device = Device {
            stat: sys.join("stat"),
            name,
        };
        device.counters()?;
        Ok(device)
    }

    /// The counters now.
    pub fn counters(&self) -> Result<DeviceCounters> {
        let text =
            std::fs::read_to_string(&self.stat).ctx(format!("reading {}", self.stat.display()))?;
        let fields: Vec<u64> = text
            .split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        match fields.as_slice() {
            [reads, _, sectors, ..] => Ok(DeviceCounters {
                read_requests: *reads,
                read_sectors: *sectors,
            }),
            _ => Err(format!("unexpected contents of {}", self.stat.display())),
        }
    }
}

/// One measurement: how long it took and what the device did meanwhile.
#[derive(Clone, Copy, Debug, Default)]
pub struct Measured {
    /// Wall-clock time of the measured work.
    pub elapsed: Duration,
    /// Read requests the device completed meanwhile (from anyone).
    pub read_requests: u64,
    /// 512-byte sectors the device read meanwhile (for anyone).
    pub read_sectors: u64,
    /// Bytes that this process, its finished children and the daemon
    /// caused to be read from storage (`read_bytes` of `/proc/PID/io`):
    /// less than the device read when other programs used the disk meanwhile.
    pub own_read_bytes: u64,
    /// CPU time the daemon spent meanwhile, if the work went through one.
    pub daemon_cpu: Option<Duration>,
    /// CPU time the whole machine spent meanwhile (every process: the
    /// reader, the daemon, the kernel's I/O; the hogs of the busy
    /// workload too), to the clock tick.
    pub machine_cpu: Duration,
}

/// Drops the caches, waits for the device to go quiet, then runs `work` and
/// measures it; `daemon` is the mount's daemon, if the work goes through one.
pub fn cold<T>(
    device: &Device,
    daemon: Option<u32>,
    work: impl FnOnce() -> Result<T>,
) -> Result<(T, Measured)> {
    cold_after(device, daemon, || Ok(()), work)
}

/// [`cold`], running `prepare` after dropping the caches and before
/// measuring: a tool hashes an empty file first, so that loading its
/// program and libraries from disk is not counted as reading the file.
pub fn cold_after<T>(
    device: &Device,
    daemon: Option<u32>,
    prepare: impl FnOnce() -> Result<()>,
    work: impl FnOnce() -> Result<T>,
) -> Result<(T, Measured)> {
    drop_caches()?;
    prepare()?;
    settle(device)?;
    measured(device, daemon, work)
}

/// Runs `work` with the caches as they are and measures it.
pub fn measured<T>(
    device: &Device,
    daemon: Option<u32>,
    work: impl FnOnce() -> Result<T>,
) -> Result<(T, Measured)> {
    check_interrupted()?;
    let own_before = own_read_bytes(daemon);
    let cpu_before = daemon.and_then(cpu_time);
    let machine_before = machine_cpu_time();
    let before = device.counters()?;
    let start = Instant::now();
    let value = work()?;
    let elapsed = start.elapsed();
    let after = device.counters()?;
    let own_after = own_read_bytes(daemon);
    let cpu_after = daemon.and_then(cpu_time);
    let machine_after = machine_cpu_time();
    Ok((
        value,
        Measured {
            elapsed,
            read_requests: after.read_requests.saturating_sub(before.read_requests),
            read_sectors: after.read_sectors.saturating_sub(before.read_sectors),
            own_read_bytes: own_after.saturating_sub(own_before),
            daemon_cpu: cpu_before.zip(cpu_after).map(|(b, a)| a.saturating_sub(b)),
            machine_cpu: machine_after.saturating_sub(machine_before),
        },
    ))
}

/// Bytes read from storage so far by this process, its reaped children and
/// `daemon`.
fn own_read_bytes(daemon: Option<u32>) -> u64 {
    let io = |pid: &str| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("read_bytes:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    // A process's count includes its reaped children's (the tools'); the
    // daemon is still running, so it is counted on its own.
    io("self") + daemon.map_or(0, |pid| io(&pid.to_string()))
}

/// CPU time the whole machine has spent busy so far (`/proc/stat`: user,
/// nice, system, irq, softirq and steal time of every CPU; not idle nor
/// I/O wait), in clock ticks of 10 ms.
fn machine_cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    let busy: u64 = [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| ticks.get(i))
        .sum();
    Duration::from_millis(busy * 10)
}

/// CPU time of process `pid` so far, summed over its threads to the
/// nanosecond (`/proc/PID/task/TID/schedstat`; the clock ticks of
/// `/proc/PID/stat` are too coarse for a read of a fraction of a second).
/// The daemon's threads live as long as it does, so none is missed.
fn cpu_time(pid: u32) -> Option<Duration> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut nanos = 0u64;
    for task in tasks {
        let path = task.ok()?.path().join("schedstat");
        let text = std::fs::read_to_string(path).ok()?;
        nanos += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(nanos))
}

/// How often [`settle`] looks at the device, how many unchanged looks in a
/// row make it quiet, and how long it waits at most.
const SETTLE_POLL: Duration = Duration::from_millis(20);
const SETTLE_QUIET_POLLS: u32 = 5;
const SETTLE_MAX: Duration = Duration::from_secs(1);

/// Waits until the device has completed no read for a while (at most
/// [`SETTLE_MAX`]). Dropping the caches makes every other running program
/// read its code and files back in a burst; on a shared machine those reads
/// would otherwise be counted as ours.
fn settle(device: &Device) -> Result<()> {
    let start = Instant::now();
    let mut last = device.counters()?.read_requests;
    let mut quiet = 0;
    while quiet < SETTLE_QUIET_POLLS && start.elapsed() < SETTLE_MAX {
        std::thread::sleep(SETTLE_POLL);
        let now = device.counters()?.read_requests;
        quiet = if now == last { quiet + 1 } else { 0 };
        last = now;
    }
    Ok(())
}

/// Reads `path` from start to end with `read(2)` into one `chunk`-byte
/// buffer, as `cat FILE > /dev/null` does; returns the bytes read.
pub fn read_sequential(path: &Path, chunk: usize) -> Result<u64> {
    read_whole(path, &mut vec![0u8; chunk])
}

/// [`read_sequential`] into the caller's buffer.
pub fn read_whole(path: &Path, buf: &mut [u8]) -> Result<u64> {
    let what = || format!("reading '{}'", path.display());
    let mut file = File::open(path).ctx(what())?;
    let mut total = 0u64;
    loop {
        match file.read(buf) {
            Ok(0) => return Ok(total),
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).ctx(what()),
        }
        check_interrupted()?;
    }
}

/// Runs `program args...` with its output discarded; fails unless it exits 0.
pub fn run_tool(program: &str, args: &[&std::ffi::OsStr]) -> Result<()> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .ctx(format!("can't run {program}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Whether `program` can be found in `PATH`.
pub fn have_tool(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// What a library-level read reports.
#[derive(Clone, Copy, Debug)]
pub struct LibraryRead {
    /// Bytes read (and verified).
    pub bytes: u64,
    /// The file's counters after the read.
    pub stats: Snapshot,
}

/// Reads the backing verity file `path` from start to end through
/// [`VerityFile::read_at`] in [`LIBRARY_CHUNK`]-byte reads, with Merkle
/// tree readahead on or off; no FUSE involved.
pub fn read_library(path: &Path, merkle_readahead: bool) -> Result<LibraryRead> {
    let what = || format!("verified read of '{}'", path.display());
    let verifier = Verifier::new(ReadOptions {
        merkle_readahead,
        ..ReadOptions::default()
    });
    let file = File::open(path).ctx(what())?;
    let file = VerityFile::open(&verifier, file, path).ctx(what())?;
    let mut buf = vec![0u8; LIBRARY_CHUNK];
    let mut pos = 0u64;
    loop {
        let n = file.read_at(&mut buf, pos).ctx(what())?;
        if n == 0 {
            break;
        }
        pos += n as u64;
    }
    Ok(LibraryRead {
        bytes: pos,
        stats: file.stats().snapshot(),
    })
}

/// `n` random block-aligned offsets of [`RANDOM_READ_SIZE`]-byte reads
/// inside a `size`-byte file, from a fixed seed.
pub fn random_offsets(size: u64, n: usize) -> Vec<u64> {
    let blocks = (size / RANDOM_READ_SIZE).max(1);
    let mut rng = fastrand::Rng::with_seed(RANDOM_SEED);
    (0..n)
        .map(|_| rng.u64(..blocks) * RANDOM_READ_SIZE)
        .collect()
}

/// Opens `path`, tells the kernel the access is random (so each read is a
/// 4 KiB read, not a readahead window), and returns it.
pub fn open_random(path: &Path) -> Result<File> {
    let file = File::open(path).ctx(format!("can't open '{}'", path.display()))?;
    rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::Random)
        .ctx(format!("posix_fadvise('{}')", path.display()))?;
    Ok(file)
}

/// Reads [`RANDOM_READ_SIZE`] bytes at each offset with `pread`; returns
/// the latency of each read.
pub fn random_reads(file: &File, offsets: &[u64]) -> Result<Vec<Duration>> {
    let mut buf = vec![0u8; RANDOM_READ_SIZE as usize];
    let mut latencies = Vec::with_capacity(offsets.len());
    for &offset in offsets {
        let start = Instant::now();
        file.read_exact_at(&mut buf, offset)
            .ctx(format!("4 KiB read at {offset}"))?;
        latencies.push(start.elapsed());
        check_interrupted()?;
    }
    Ok(latencies)
}

/// Peak resident set size of process `pid` (`VmHWM`), in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    status_field(pid, "VmHWM:")
}

/// Resident set size of process `pid` now (`VmRSS`), in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    status_field(pid, "VmRSS:")
}

fn status_field(pid: u32, name: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> [f64; 3] {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut fields = text
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(f64::NAN));
    [(); 3].map(|()| fields.next().unwrap_or(f64::NAN))
}

/// The CPU model and the number of CPUs this process may use.
pub fn cpu() -> (String, usize) {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (model, cpus)
}

/// The median (mean of the two middle values for an even count).
pub fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_aligned_in_range_and_fixed() {
        let a = random_offsets(10 << 20, 100);
        assert_eq!(a, random_offsets(10 << 20, 100));
        assert!(a.iter().all(|o| o % 4096 == 0 && o + 4096 <= 10 << 20));
        assert!(a.iter().any(|&o| o != a[0]));
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
    }

    #[test]
    fn root_filesystem_has_counters_or_says_why() {
        // Either a device with counters, or a clear message (containers).
        match Device::of(Path::new("/")) {
            Ok(d) => assert!(!d.name.is_empty()),
            Err(e) => assert!(e.contains("block device"), "{e}"),
        }
    }
}
