//! `verityfs bench`: reproduces the experiment of the 2019 kernel patch
//! "fs-verity: implement readahead of Merkle tree pages" on our own mount,
//! in one run, side by side with its anchors.
//!
//! Every cold measurement runs after `sync; echo 3 > /proc/sys/vm/drop_caches`
//! (so it needs root), on a freshly started mount (so the daemon's tree
//! block cache is cold too), and counts the read requests of the device
//! holding `--dir`. Each run measures, in this order:
//!
//! 1. a `cat`-like read (128 KiB `read(2)`s), `sha256sum` and
//!    `openssl dgst -sha256` of the plain file in the backing directory;
//! 2. the plain file, then the verity file, read through a mount with Merkle
//!    tree readahead, and the verity file through a mount without it;
//! 3. the backing verity file read through `VerityFile::read_at` (no FUSE),
//!    readahead on and off, with the library's tree I/O counters;
//! 4. random 4 KiB reads of the verity and the plain file through the mount,
//!    cold, then the same reads warm.
//!
//! Then, with `--huge`, a sparse verity file of that size is read through
//! the mount for the daemon's peak memory. The medians go to stdout as a
//! table, to `--json` and to a PNG chart at `--chart`.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::bench::files::{TestFiles, HUGE_NAME, PLAIN_NAME, VERITY_NAME};
use crate::bench::measure::{
    self, cold, cold_after, open_random, peak_rss_kib, random_offsets, random_reads, read_library,
    read_sequential, rss_kib, run_tool, Device, CAT_CHUNK, LIBRARY_CHUNK, RANDOM_READS,
};
use crate::bench::mount::Mount;
use crate::bench::report::{HugeSample, RandomSample, Report, Run, Seq, SeqSample};
use crate::bench::{note, Config, Context, Result};
use crate::commands::Command;
use crate::error::Error;
use crate::opts::{exactly, Args, Hint, Operand, Opt};

/// Default `--dir`.
const DEFAULT_DIR: &str = "/var/tmp/verityfs-bench";
/// Default `--size`: the 2019 patch's 250 MB file.
const DEFAULT_SIZE: u64 = 250_000_000;
/// Default `--runs`.
const DEFAULT_RUNS: usize = 3;
/// Smallest `--size`: one random read must fit.
const MIN_SIZE: u64 = 64 << 10;

/// The tools the anchors run.
const TOOLS: &[(&str, &str)] = &[("sha256sum", "coreutils"), ("openssl", "openssl")];

/// Options as given, before defaults that depend on `--dir`.
#[derive(Default)]
pub struct BenchArgs {
    dir: Option<PathBuf>,
    size: Option<u64>,
    runs: Option<usize>,
    json: Option<PathBuf>,
    chart: Option<PathBuf>,
    huge: Option<u64>,
}

impl Args for BenchArgs {
    const OPTIONS: &'static [Opt<Self>] = &[
        Opt::<Self>::value(
            "dir",
            "DIR",
            "Directory for the test files, mount point and outputs",
            |a, v| {
                a.dir = Some(v.into());
                Ok(())
            },
        )
        .hint(Hint::Dir)
        .doc("On the disk to measure (default /var/tmp/verityfs-bench)."),
        Opt::<Self>::value(
            "size",
            "BYTES",
            "Size of the test file in bytes, with a K, M or G suffix (default 250000000)",
            |a, v| {
                let text = v.to_string_lossy();
                match parse_size(&text) {
                    Some(n) if n >= MIN_SIZE => {
                        a.size = Some(n);
                        Ok(())
                    }
                    _ => Err(Error::usage_msg(format!(
                        "invalid --size: {text} (bytes, at least {MIN_SIZE}; K, M, G suffixes are powers of 1024)"
                    ))),
                }
            },
        ),
        Opt::<Self>::value(
            "runs",
            "N",
            "Runs of every measurement; the median is reported (default 3)",
            |a, v| {
                let text = v.to_string_lossy();
                match text.parse::<usize>() {
                    Ok(n @ 1..=100) => {
                        a.runs = Some(n);
                        Ok(())
                    }
                    _ => Err(Error::usage_msg(format!(
                        "invalid --runs: {text} (1 to 100)"
                    ))),
                }
            },
        ),
        Opt::<Self>::value(
            "json",
            "FILE",
            "Where to write the results as JSON (default DIR/bench.json)",
            |a, v| {
                a.json = Some(v.into());
                Ok(())
            },
        )
        .hint(Hint::File),
        Opt::<Self>::value(
            "chart",
            "FILE",
            "Where to draw the PNG bar chart (default DIR/bench.png)",
            |a, v| {
                a.chart = Some(v.into());
                Ok(())
            },
        )
        .hint(Hint::File),
        Opt::<Self>::value(
            "huge",
            "BYTES",
            "Also read a sparse verity file of this size (e.g. 10G) through the mount",
            |a, v| {
                let text = v.to_string_lossy();
                match parse_size(&text) {
                    Some(n) if n >= MIN_SIZE => {
                        a.huge = Some(n);
                        Ok(())
                    }
                    _ => Err(Error::usage_msg(format!(
                        "invalid --huge: {text} (bytes, e.g. 10G)"
                    ))),
                }
            },
        )
        .doc("And report the daemon's peak memory."),
    ];
    const OPERANDS: &'static [Operand] = &[];

    fn run(self, _: &Command, operands: Vec<OsString>) -> std::result::Result<(), Error> {
        let [] = exactly(operands)?;
        let dir = self.dir.unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
        let config = Config {
            json: self.json.unwrap_or_else(|| dir.join("bench.json")),
            chart: self.chart.unwrap_or_else(|| dir.join("bench.png")),
            size: self.size.unwrap_or(DEFAULT_SIZE),
            runs: self.runs.unwrap_or(DEFAULT_RUNS),
            huge: self.huge,
            dir,
        };
        if !measure::is_root() {
            return Err(Error::msg(
                "verityfs bench must run as root: it drops the page cache \
                 (echo 3 > /proc/sys/vm/drop_caches) before every cold read and mounts FUSE filesystems",
            ));
        }
        bench(&config).map_err(Error::msg)
    }
}

/// A byte count with an optional K, M or G suffix (powers of 1024, as for
/// `verityfs mount --cache-size`).
fn parse_size(text: &str) -> Option<u64> {
    let (digits, shift) = match text.as_bytes().last()? {
        b'K' | b'k' => (&text[..text.len() - 1], 10),
        b'M' | b'm' => (&text[..text.len() - 1], 20),
        b'G' | b'g' => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// The whole benchmark.
fn bench(config: &Config) -> Result<()> {
    std::fs::create_dir_all(&config.dir).ctx(format!("can't create '{}'", config.dir.display()))?;
    let device = Device::of(&config.dir)?;
    for (tool, package) in TOOLS {
        if !measure::have_tool(tool) {
            return Err(format!("{tool} not found (install {package})"));
        }
    }
    let load_start = measure::load_average();
    note(format!(
        "{} runs in {} (device {}), load average {:.2}",
        config.runs,
        config.dir.display(),
        device.name,
        load_start[0]
    ));
    let files = TestFiles::create(&config.dir, config.size, config.huge)?;
    let mountpoint = config.dir.join("mnt");
    let _cleanup = Cleanup(&files, &mountpoint);
    let offsets = random_offsets(config.size, RANDOM_READS);
    let mut runs = Vec::with_capacity(config.runs);
    for i in 0..config.runs {
        note(format!("run {}/{}", i + 1, config.runs));
        runs.push(one_run(&files, &mountpoint, &device, &offsets)?);
    }
    let huge = match config.huge {
        Some(size) => Some(measure_huge(&files, &mountpoint, &device, size)?),
        None => None,
    };
    let report = Report {
        config: config.clone(),
        device: device.name.clone(),
        cpu: measure::cpu(),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned(),
        load: [load_start, measure::load_average()],
        runs,
        huge,
    };
    let summary = report.summary();
    crate::output::print_stdout(report.table(&summary).as_bytes());
    let json = serde_json::to_string_pretty(&report.json(&summary)).expect("JSON of plain values");
    write_output(&config.json, format!("{json}\n").as_bytes())?;
    report.chart(&summary, &config.chart)?;
    note(format!(
        "wrote {} and {}",
        config.json.display(),
        config.chart.display()
    ));
    Ok(())
}

/// Removes the test files and the mount point when the benchmark ends,
/// however it ends (after the mounts, which are dropped first).
struct Cleanup<'a>(&'a TestFiles, &'a Path);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        self.0.remove();
        let _ = std::fs::remove_dir(self.1);
    }
}

fn write_output(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).ctx(format!("can't create '{}'", parent.display()))?;
    }
    std::fs::write(path, bytes).ctx(format!("can't write '{}'", path.display()))
}

/// Checks that a read returned the whole file.
fn whole(path: &Path, got: u64, want: u64) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "read {got} bytes of '{}', expected {want}",
            path.display()
        ))
    }
}

/// Every measurement once.
fn one_run(files: &TestFiles, mountpoint: &Path, device: &Device, offsets: &[u64]) -> Result<Run> {
    let size = files.size;
    let plain = files.backing_path(PLAIN_NAME);
    let verity = files.backing_path(VERITY_NAME);
    let mut run = Run::default();
    let sample = |c: measure::Cold| SeqSample {
        seconds: c.elapsed.as_secs_f64(),
        device_read_requests: c.read_requests,
        device_read_bytes: c.read_bytes,
        own_read_bytes: c.own_read_bytes,
        ..SeqSample::default()
    };

    // The anchors, on the backing file.
    let (n, c) = cold(device, None, || read_sequential(&plain, CAT_CHUNK))?;
    whole(&plain, n, size)?;
    run.seq.insert(Seq::PlainCat, sample(c));
    for (case, tool, args) in [
        (Seq::Sha256sum, "sha256sum", &[][..]),
        (Seq::Openssl, "openssl", &["dgst", "-sha256"][..]),
    ] {
        let hash = |file: &Path| {
            let mut all: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
            all.push(file.as_os_str());
            run_tool(tool, &all)
        };
        let warm_up = || hash(Path::new("/dev/null"));
        let ((), c) = cold_after(device, None, warm_up, || hash(&plain))?;
        run.seq.insert(case, sample(c));
    }

    // Through the mount: a fresh daemon each time, so its tree cache is cold.
    for (case, name, readahead) in [
        (Seq::MountPlain, PLAIN_NAME, true),
        (Seq::MountVerityOn, VERITY_NAME, true),
        (Seq::MountVerityOff, VERITY_NAME, false),
    ] {
        let mount = Mount::start(&files.backing, mountpoint, readahead)?;
        let path = mount.path(name);
        let (n, c) = cold(device, mount.pid(), || read_sequential(&path, CAT_CHUNK))?;
        whole(&path, n, size)?;
        let rss = mount.pid().and_then(peak_rss_kib);
        mount.stop()?;
        run.seq.insert(
            case,
            SeqSample {
                daemon_peak_rss_kib: rss,
                ..sample(c)
            },
        );
    }

    // The library alone.
    for (case, readahead) in [(Seq::LibraryOn, true), (Seq::LibraryOff, false)] {
        let (read, c) = cold(device, None, || read_library(&verity, readahead))?;
        whole(&verity, read.bytes, size)?;
        run.seq.insert(
            case,
            SeqSample {
                tree: Some(read.stats),
                ..sample(c)
            },
        );
    }

    // Random 4 KiB reads through the mount, cold then warm.
    let mount = Mount::start(&files.backing, mountpoint, true)?;
    let random = |name: &str| -> Result<(f64, f64, u64)> {
        let file = open_random(&mount.path(name))?;
        let (cold_latency, c) = cold(device, mount.pid(), || random_reads(&file, offsets))?;
        let warm_latency = random_reads(&file, offsets)?;
        Ok((
            cold_latency.as_secs_f64() * 1e6,
            warm_latency.as_secs_f64() * 1e6,
            c.read_requests,
        ))
    };
    let (verity_cold_us, verity_warm_us, verity_cold_requests) = random(VERITY_NAME)?;
    let (plain_cold_us, plain_warm_us, plain_cold_requests) = random(PLAIN_NAME)?;
    mount.stop()?;
    run.random = RandomSample {
        verity_cold_us,
        plain_cold_us,
        verity_warm_us,
        plain_warm_us,
        verity_cold_requests,
        plain_cold_requests,
    };
    Ok(run)
}

/// Reads the sparse verity file through a fresh mount and records the
/// daemon's memory.
fn measure_huge(
    files: &TestFiles,
    mountpoint: &Path,
    device: &Device,
    size: u64,
) -> Result<HugeSample> {
    note(format!(
        "reading the {size}-byte sparse verity file through the mount"
    ));
    let mount = Mount::start(&files.backing, mountpoint, true)?;
    let pid = mount.pid().ok_or("the mount's daemon is gone")?;
    let path = mount.path(HUGE_NAME);
    let rss_before_kib = rss_kib(pid).unwrap_or(0);
    let (n, c) = cold(device, Some(pid), || read_sequential(&path, LIBRARY_CHUNK))?;
    whole(&path, n, size)?;
    let peak_rss_kib = peak_rss_kib(pid).ok_or("can't read the daemon's VmHWM")?;
    mount.stop()?;
    Ok(HugeSample {
        size,
        seconds: c.elapsed.as_secs_f64(),
        rss_before_kib,
        peak_rss_kib,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("250000000"), Some(250_000_000));
        assert_eq!(parse_size("8M"), Some(8 << 20));
        assert_eq!(parse_size("10G"), Some(10 << 30));
        assert_eq!(parse_size("4k"), Some(4096));
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("M"), None);
        assert_eq!(parse_size("x1"), None);
    }

    #[test]
    fn options() {
        let mut args = BenchArgs::default();
        let mut set = |name: &str, value: &str| {
            let opt = BenchArgs::OPTIONS.iter().find(|o| o.spec.long == name);
            (opt.unwrap().set)(&mut args, value.into()).is_ok()
        };
        assert!(set("size", "8M"));
        assert!(set("runs", "5"));
        assert!(!set("runs", "0"));
        assert!(!set("size", "1K"));
        assert_eq!((args.size, args.runs), (Some(8 << 20), Some(5)));
    }
}
