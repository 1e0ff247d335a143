//! `verityfs bench`: how reading verity files through a verityfs mount
//! compares with reading the same bytes from a plain file, in one run, in
//! several workloads: small files, random 4 KiB reads, a sequential read,
//! parallel readers, a sequential read on a busy machine and a warm reread.
//!
//! Each workload is measured reading the plain file directly, the plain file
//! through the mount and the verity file through the mount (the sequential
//! read also against `sha256sum`, `openssl dgst -sha256` and the library's
//! verified read), and the report gives the verity file's time and device
//! reads as ratios to those anchors.
//!
//! The test files live on an ext4 filesystem in a scratch image under
//! `--dir`, on a loop device made for the run, so that the device's read
//! counters count this benchmark's reads and nothing else (`--dir-device`
//! counts those of the disk holding `--dir` instead). Every cold measurement
//! runs after `sync; echo 3 > /proc/sys/vm/drop_caches` and on a freshly
//! started mount, so root is needed. The medians go to stdout as a table, to
//! `--json` and to a PNG chart at `--chart`; the scratch files, mounts and
//! loop device are removed at the end, also after an error or Ctrl-C.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::bench::files::{Sizes, TestFiles, HUGE_NAME, VERITY_DIR};
use crate::bench::loopdev::{LoopDisk, ScratchDir};
use crate::bench::measure::{self, cold, peak_rss_kib, random_offsets, read_sequential, rss_kib};
use crate::bench::measure::{Device, LIBRARY_CHUNK};
use crate::bench::mount::Mount;
use crate::bench::report::{HugeSample, Report, Run};
use crate::bench::workloads::{Bench, Workload, GROUPS};
use crate::bench::{catch_signals, note, Config, Context, Result};
use crate::commands::Command;
use crate::error::Error;
use crate::opts::{exactly, Args, Hint, Operand, Opt};

const DEFAULT_DIR: &str = "/var/tmp/verityfs-bench";
/// Default `--size`.
const DEFAULT_SIZE: u64 = 200_000_000;
/// Default `--files`.
const DEFAULT_FILES: usize = 2000;
/// Default `--reads`.
const DEFAULT_READS: usize = 3000;
/// Default `--runs`.
const DEFAULT_RUNS: usize = 3;
/// Smallest `--size`: one random read must fit.
const MIN_SIZE: u64 = 64 << 10;

/// Options as given, before defaults that depend on `--dir`.
#[derive(Default)]
pub struct BenchArgs {
    dir: Option<PathBuf>,
    size: Option<u64>,
    files: Option<usize>,
    reads: Option<usize>,
    runs: Option<usize>,
    workloads: Option<Vec<Workload>>,
    dir_device: bool,
    json: Option<PathBuf>,
    chart: Option<PathBuf>,
    huge: Option<u64>,
}

impl Args for BenchArgs {
    const OPTIONS: &'static [Opt<Self>] = &[
        Opt::<Self>::value(
            "dir",
            "DIR",
            "Directory for the scratch filesystem image, mount points and outputs",
            |a, v| {
                a.dir = Some(v.into());
                Ok(())
            },
        )
        .hint(Hint::Dir)
        .doc("Default /var/tmp/verityfs-bench."),
        Opt::<Self>::value(
            "workload",
            "LIST",
            "Comma-separated workloads to run: small, random, seq, parallel, busy, warm or all (default all)",
            |a, v| {
                let text = v.to_string_lossy();
                match Workload::parse_list(&text) {
                    Some(list) => {
                        a.workloads = Some(list);
                        Ok(())
                    }
                    None => Err(Error::usage_msg(format!(
                        "invalid --workload: {text} (comma-separated: {} or all)",
                        GROUPS.join(", ")
                    ))),
                }
            },
        ),
        Opt::<Self>::value(
            "size",
            "BYTES",
            "Size of the large file in bytes, with a K, M or G suffix (default 200000000)",
            |a, v| set_size(&mut a.size, "size", v),
        )
        .doc("The parallel readers' files are 1/8 of it."),
        Opt::<Self>::value(
            "files",
            "N",
            "Number of 16 KiB files the small-file workload reads (default 2000)",
            |a, v| set_count(&mut a.files, "files", 1_000_000, v),
        ),
        Opt::<Self>::value(
            "reads",
            "N",
            "Number of 4 KiB reads of the random workload (default 3000)",
            |a, v| set_count(&mut a.reads, "reads", 10_000_000, v),
        ),
        Opt::<Self>::value(
            "runs",
            "N",
            "Runs of every measurement; the median is reported (default 3)",
            |a, v| set_count(&mut a.runs, "runs", 100, v),
        ),
        Opt::<Self>::flag(
            "dir-device",
            "Count the requests of the disk holding DIR instead of a loop device made for the run",
            |a, _| {
                a.dir_device = true;
                Ok(())
            },
        )
        .doc("The test files are then put in DIR itself, and other programs' reads of that disk are counted too."),
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
            "Where to draw the PNG chart (default DIR/bench.png)",
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
            |a, v| set_size(&mut a.huge, "huge", v),
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
            files: self.files.unwrap_or(DEFAULT_FILES),
            reads: self.reads.unwrap_or(DEFAULT_READS),
            runs: self.runs.unwrap_or(DEFAULT_RUNS),
            workloads: self.workloads.unwrap_or_else(|| Workload::ALL.to_vec()),
            dir_device: self.dir_device,
            huge: self.huge,
            dir,
        };
        if !measure::is_root() {
            return Err(Error::msg(
                "verityfs bench must run as root: it drops the page cache \
                 (echo 3 > /proc/sys/vm/drop_caches) before every cold read, and sets up a loop device and FUSE mounts",
            ));
        }
        bench(&config).map_err(|e| Error::msg(crate::bench::explain(e)))
    }
}

/// A count from 1 to `max` for `--NAME`.
fn set_count(
    slot: &mut Option<usize>,
    name: &str,
    max: usize,
    value: OsString,
) -> std::result::Result<(), Error> {
    let text = value.to_string_lossy();
    match text.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => {
            *slot = Some(n);
            Ok(())
        }
        _ => Err(Error::usage_msg(format!(
            "invalid --{name}: {text} (1 to {max})"
        ))),
    }
}

/// A byte count of at least [`MIN_SIZE`] for `--NAME`.
fn set_size(slot: &mut Option<u64>, name: &str, value: OsString) -> std::result::Result<(), Error> {
    let text = value.to_string_lossy();
    match parse_size(&text) {
        Some(n) if n >= MIN_SIZE => {
            *slot = Some(n);
            Ok(())
        }
        _ => Err(Error::usage_msg(format!(
            "invalid --{name}: {text} (bytes, at least {MIN_SIZE}; K, M, G suffixes are powers of 1024)"
        ))),
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

/// The tools the sequential read's anchors run.
const TOOLS: &[(&str, &str)] = &[("sha256sum", "coreutils"), ("openssl", "openssl")];

/// The whole benchmark.
fn bench(config: &Config) -> Result<()> {
    if config.workloads.contains(&Workload::Seq) {
        for (tool, package) in TOOLS {
            if !measure::have_tool(tool) {
                return Err(format!("{tool} not found (install {package})"));
            }
        }
    }
    catch_signals();
    let load_start = measure::load_average();
    // Dropped in reverse order: the loop device's filesystem is unmounted
    // before the scratch directory holding its image is removed.
    let scratch = ScratchDir::create(&config.dir)?;
    let sizes = Sizes::of(config);
    let disk = match config.dir_device {
        true => None,
        false => Some(LoopDisk::create(scratch.path(), sizes.filesystem_bytes())?),
    };
    let root = disk.as_ref().map_or(scratch.path(), LoopDisk::root);
    let device = Device::of(root)?;
    note(format!(
        "{} run{} on device {}, load average {:.2}",
        config.runs,
        if config.runs == 1 { "" } else { "s" },
        device.name,
        load_start[0]
    ));
    let files = TestFiles::create(&root.join("backing"), sizes)?;
    let mountpoint = scratch.path().join("mnt");
    let bench = Bench {
        files: &files,
        mountpoint: &mountpoint,
        device: &device,
        offsets: random_offsets(config.size, config.reads),
    };
    let mut runs = Vec::with_capacity(config.runs);
    for i in 0..config.runs {
        let mut run = Run::new();
        for &workload in &config.workloads {
            note(format!("run {}/{}: {}", i + 1, config.runs, workload.key()));
            for &variant in workload.variants() {
                run.insert((workload, variant), bench.measure(workload, variant)?);
            }
        }
        runs.push(run);
    }
    let huge = match config.huge {
        Some(size) => Some(measure_huge(&files, &mountpoint, &device, size)?),
        None => None,
    };
    let report = Report {
        config: config.clone(),
        sizes,
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
    let summaries = report.summary();
    crate::output::print_stdout(report.table(&summaries).as_bytes());
    let json =
        serde_json::to_string_pretty(&report.json(&summaries)).expect("JSON of plain values");
    write_output(&config.json, format!("{json}\n").as_bytes())?;
    report.chart(&summaries, &config.chart)?;
    note(format!(
        "wrote {} and {}",
        config.json.display(),
        config.chart.display()
    ));
    Ok(())
}

fn write_output(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).ctx(format!("can't create '{}'", parent.display()))?;
    }
    std::fs::write(path, bytes).ctx(format!("can't write '{}'", path.display()))
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
    let mount = Mount::start(&files.backing, mountpoint)?;
    let pid = mount.pid().ok_or("the mount's daemon is gone")?;
    let path = mount.path(VERITY_DIR).join(HUGE_NAME);
    let rss_before_kib = rss_kib(pid).unwrap_or(0);
    let (n, c) = cold(device, Some(pid), || read_sequential(&path, LIBRARY_CHUNK))?;
    if n != size {
        return Err(format!(
            "read {n} bytes of '{}', expected {size}",
            path.display()
        ));
    }
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
        assert!(set("workload", "seq,warm"));
        assert!(!set("workload", "seq,fast"));
        assert!(set("files", "10"));
        assert!(!set("reads", "-1"));
        assert!(set("dir-device", ""));
        assert_eq!((args.size, args.runs), (Some(8 << 20), Some(5)));
        assert_eq!(args.workloads, Some(vec![Workload::Seq, Workload::Warm]));
        assert_eq!((args.files, args.dir_device), (Some(10), true));
    }
}
