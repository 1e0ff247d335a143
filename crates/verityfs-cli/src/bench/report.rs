//! What a benchmark found: the samples of every run, their medians and the
//! ratios the issues judge, printed as a table, written as JSON and drawn as
//! a PNG bar chart.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::{json, Map, Value};
use verityfs::Snapshot;

use super::measure::{CAT_CHUNK, LIBRARY_CHUNK, RANDOM_READS, RANDOM_READ_SIZE, RANDOM_SEED};
use super::{Config, Context, Result};

/// The cold sequential reads, in table order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Seq {
    /// `cat`-like read of the plain file, directly from the backing directory.
    PlainCat,
    /// coreutils `sha256sum` of the plain file.
    Sha256sum,
    /// `openssl dgst -sha256` of the plain file.
    Openssl,
    /// The plain file read through the mount.
    MountPlain,
    /// The verity file read through the mount, Merkle tree readahead on.
    MountVerityOn,
    /// The same with `--no-merkle-readahead`.
    MountVerityOff,
    /// `VerityFile::read_at` of the backing verity file, readahead on.
    LibraryOn,
    /// The same, readahead off.
    LibraryOff,
}

impl Seq {
    /// Every case, in table order.
    pub const ALL: [Seq; 8] = [
        Seq::PlainCat,
        Seq::Sha256sum,
        Seq::Openssl,
        Seq::MountPlain,
        Seq::MountVerityOn,
        Seq::MountVerityOff,
        Seq::LibraryOn,
        Seq::LibraryOff,
    ];

    /// Its JSON key.
    pub fn key(self) -> &'static str {
        match self {
            Seq::PlainCat => "plain_cat",
            Seq::Sha256sum => "sha256sum",
            Seq::Openssl => "openssl_dgst_sha256",
            Seq::MountPlain => "mount_plain",
            Seq::MountVerityOn => "mount_verity_readahead_on",
            Seq::MountVerityOff => "mount_verity_readahead_off",
            Seq::LibraryOn => "library_verity_readahead_on",
            Seq::LibraryOff => "library_verity_readahead_off",
        }
    }

    /// Its label in the table and the chart.
    pub fn label(self) -> &'static str {
        match self {
            Seq::PlainCat => "plain cat (backing file)",
            Seq::Sha256sum => "sha256sum (backing file)",
            Seq::Openssl => "openssl dgst -sha256 (backing file)",
            Seq::MountPlain => "plain file through mount",
            Seq::MountVerityOn => "verity file, mount, readahead on",
            Seq::MountVerityOff => "verity file, mount, readahead off",
            Seq::LibraryOn => "VerityFile::read_at, readahead on",
            Seq::LibraryOff => "VerityFile::read_at, readahead off",
        }
    }

    fn color(self) -> RGBColor {
        match self {
            Seq::PlainCat | Seq::Sha256sum | Seq::Openssl => RGBColor(128, 128, 128),
            Seq::MountPlain => RGBColor(70, 130, 180),
            Seq::MountVerityOn => RGBColor(34, 139, 34),
            Seq::MountVerityOff => RGBColor(205, 92, 92),
            Seq::LibraryOn => RGBColor(102, 205, 170),
            Seq::LibraryOff => RGBColor(240, 160, 122),
        }
    }
}

/// One cold sequential read.
#[derive(Clone, Copy, Debug, Default)]
pub struct SeqSample {
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Device read requests meanwhile.
    pub device_read_requests: u64,
    /// Bytes the device read meanwhile.
    pub device_read_bytes: u64,
    /// Bytes our processes (this one, the tools, the daemon) read from
    /// storage meanwhile.
    pub own_read_bytes: u64,
    /// The daemon's peak RSS in KiB (reads through the mount).
    pub daemon_peak_rss_kib: Option<u64>,
    /// The file's read path counters (library reads).
    pub tree: Option<Snapshot>,
}

/// The random 4 KiB reads of one run, through the mount.
#[derive(Clone, Copy, Debug, Default)]
pub struct RandomSample {
    /// Mean latency of the verity file's reads after dropping caches, µs.
    pub verity_cold_us: f64,
    /// The same for the plain file.
    pub plain_cold_us: f64,
    /// Mean latency of the same reads again (page cache warm), µs.
    pub verity_warm_us: f64,
    /// The same for the plain file.
    pub plain_warm_us: f64,
    /// Device read requests of the verity file's cold reads.
    pub verity_cold_requests: u64,
    /// Device read requests of the plain file's cold reads.
    pub plain_cold_requests: u64,
}

/// One run of every measurement.
#[derive(Clone, Debug, Default)]
pub struct Run {
    /// The sequential reads.
    pub seq: BTreeMap<Seq, SeqSample>,
    /// The random reads.
    pub random: RandomSample,
}

/// The `--huge` measurement.
#[derive(Clone, Copy, Debug)]
pub struct HugeSample {
    /// Size of the sparse verity file.
    pub size: u64,
    /// Seconds to read it through the mount.
    pub seconds: f64,
    /// The daemon's RSS once mounted, before the read, KiB.
    pub rss_before_kib: u64,
    /// The daemon's peak RSS after the read, KiB.
    pub peak_rss_kib: u64,
}

/// Everything measured, with the conditions.
#[derive(Clone, Debug)]
pub struct Report {
    /// The options.
    pub config: Config,
    /// The device counted.
    pub device: String,
    /// CPU model and count.
    pub cpu: (String, usize),
    /// Kernel release.
    pub kernel: String,
    /// Load averages at the start and at the end.
    pub load: [[f64; 3]; 2],
    /// The runs.
    pub runs: Vec<Run>,
    /// The `--huge` measurement.
    pub huge: Option<HugeSample>,
}

/// Medians of one sequential case over the runs.
#[derive(Clone, Debug, Default)]
pub struct SeqSummary {
    /// Median MB/s (10^6 bytes per second).
    pub mb_per_s: f64,
    /// Median seconds.
    pub seconds: f64,
    /// Median device read requests.
    pub requests: f64,
    /// Median bytes read from the device.
    pub device_bytes: f64,
    /// Median bytes our processes read from storage.
    pub own_bytes: f64,
    /// Highest daemon peak RSS, KiB.
    pub daemon_peak_rss_kib: Option<u64>,
    /// Median of each read path counter (library reads).
    pub tree: Option<Vec<(&'static str, f64)>>,
}

impl SeqSummary {
    /// Whether the device read noticeably more than our processes: other
    /// programs read from it during the measurement, so the request count
    /// is an overestimate.
    pub fn disk_shared(&self) -> bool {
        self.device_bytes > self.own_bytes * 1.05 + 256.0 * 1024.0
    }
}

/// One line of the ratios.
#[derive(Clone, Debug)]
pub struct Ratio {
    /// JSON key.
    pub key: &'static str,
    /// Table label.
    pub label: &'static str,
    /// The value (a ratio, or a percentage if `percent`).
    pub value: f64,
    /// Whether `value` is a percentage.
    pub percent: bool,
    /// The target, if any.
    pub target: Option<Target>,
    /// The same ratio computed within each run alone.
    pub per_run: Vec<f64>,
}

/// A target from the issues.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    /// value >= x
    AtLeast(f64),
    /// value <= x
    AtMost(f64),
    /// value < x
    Below(f64),
}

impl Target {
    fn met(self, value: f64) -> bool {
        match self {
            Target::AtLeast(x) => value >= x,
            Target::AtMost(x) => value <= x,
            Target::Below(x) => value < x,
        }
    }

    fn text(self, percent: bool) -> String {
        let num = |x: f64| {
            if percent {
                format!("{x}%")
            } else {
                format!("{x:.1}x")
            }
        };
        match self {
            Target::AtLeast(x) => format!(">= {}", num(x)),
            Target::AtMost(x) => format!("<= {}", num(x)),
            Target::Below(x) => format!("< {}", num(x)),
        }
    }
}

/// The medians and ratios of a report.
#[derive(Clone, Debug)]
pub struct Summary {
    /// Per sequential case.
    pub seq: BTreeMap<Seq, SeqSummary>,
    /// Median random read figures.
    pub random: RandomSample,
    /// The ratios, in table order.
    pub ratios: Vec<Ratio>,
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

fn mb_per_s(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e6
}

impl Report {
    /// Medians over the runs and the ratios.
    pub fn summary(&self) -> Summary {
        let size = self.config.size;
        let mut summary = summarize(&self.runs, size);
        let per_run: Vec<Summary> = self
            .runs
            .iter()
            .map(|run| summarize(std::slice::from_ref(run), size))
            .collect();
        for (i, ratio) in summary.ratios.iter_mut().enumerate() {
            ratio.per_run = per_run.iter().map(|s| s.ratios[i].value).collect();
        }
        summary
    }

    /// The table printed on stdout.
    pub fn table(&self, summary: &Summary) -> String {
        let c = &self.config;
        let mut t = String::new();
        let _ = writeln!(
            t,
            "verityfs bench: {} bytes ({:.1} MB), median of {} run{}, cold cache unless noted",
            c.size,
            c.size as f64 / 1e6,
            c.runs,
            if c.runs == 1 { "" } else { "s" }
        );
        let [start, end] = self.load;
        let _ = writeln!(
            t,
            "machine: {} x {}, kernel {}, device {} (dir {})",
            self.cpu.1,
            self.cpu.0,
            self.kernel,
            self.device,
            c.dir.display()
        );
        let _ = writeln!(
            t,
            "load average: {:.2} {:.2} {:.2} at start, {:.2} {:.2} {:.2} at end",
            start[0], start[1], start[2], end[0], end[1], end[2]
        );
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "{:<40} {:>9} {:>8} {:>9} {:>9} {:>8}  notes",
            "cold sequential read", "MB/s", "s", "dev reqs", "dev MB", "own MB"
        );
        let mut shared = false;
        for case in Seq::ALL {
            let s = &summary.seq[&case];
            let mut notes = String::new();
            if let Some(rss) = s.daemon_peak_rss_kib {
                let _ = write!(notes, "daemon peak RSS {:.1} MiB", rss as f64 / 1024.0);
            }
            if let Some(tree) = &s.tree {
                let get = |name| {
                    tree.iter()
                        .find(|(n, _)| *n == name)
                        .map_or(f64::NAN, |f| f.1)
                };
                let _ = write!(
                    notes,
                    "tree: {} reqs, {} blocks, {} readahead reqs",
                    get("tree_read_requests"),
                    get("tree_blocks_read"),
                    get("readahead_requests")
                );
            }
            let mark = if s.disk_shared() {
                shared = true;
                "*"
            } else {
                ""
            };
            let _ = writeln!(
                t,
                "{:<40} {:>9.1} {:>8.3} {:>9} {:>9.1} {:>8.1}{mark:1} {}",
                case.label(),
                s.mb_per_s,
                s.seconds,
                s.requests,
                s.device_bytes / 1e6,
                s.own_bytes / 1e6,
                notes
            );
        }
        if shared {
            let _ = writeln!(
                t,
                "* the device read more than our processes did: other programs used it meanwhile, \
                 and its request count includes theirs"
            );
        }
        let r = &summary.random;
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "random {} KiB reads through mount ({} reads, mean us)   cold     warm  cold dev reqs",
            RANDOM_READ_SIZE / 1024,
            RANDOM_READS
        );
        for (label, cold, warm, reqs) in [
            (
                "verity file",
                r.verity_cold_us,
                r.verity_warm_us,
                r.verity_cold_requests,
            ),
            (
                "plain file",
                r.plain_cold_us,
                r.plain_warm_us,
                r.plain_cold_requests,
            ),
        ] {
            let _ = writeln!(t, "{label:<50} {cold:>8.1} {warm:>8.2} {reqs:>14}");
        }
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "{:<48} {:>9}  {:<9} {:<7} each run",
            "ratio (of the medians)", "value", "target", ""
        );
        for ratio in &summary.ratios {
            let show = |v: f64| {
                if ratio.percent {
                    format!("{v:+.1}%")
                } else {
                    format!("{v:.2}x")
                }
            };
            let value = show(ratio.value);
            let each: Vec<String> = ratio.per_run.iter().map(|&v| show(v)).collect();
            let each = each.join(" ");
            let (target, verdict) = match ratio.target {
                Some(target) if ratio.value.is_finite() => (
                    target.text(ratio.percent),
                    if target.met(ratio.value) {
                        "ok"
                    } else {
                        "MISSED"
                    },
                ),
                Some(target) => (target.text(ratio.percent), "n/a"),
                None => (String::new(), ""),
            };
            let _ = writeln!(
                t,
                "{:<48} {value:>9}  {target:<9} {verdict:<7} {each}",
                ratio.label
            );
        }
        if let Some(h) = &self.huge {
            let _ = writeln!(t);
            let _ = writeln!(
                t,
                "{} GiB sparse verity file through mount: {:.1} MB/s, daemon RSS {:.1} MiB mounted, peak {:.1} MiB",
                h.size as f64 / (1u64 << 30) as f64,
                mb_per_s(h.size, h.seconds),
                h.rss_before_kib as f64 / 1024.0,
                h.peak_rss_kib as f64 / 1024.0
            );
        }
        t
    }

    /// The JSON document.
    pub fn json(&self, summary: &Summary) -> Value {
        let c = &self.config;
        let mut seq = Map::new();
        for case in Seq::ALL {
            let s = &summary.seq[&case];
            let mut entry = Map::new();
            entry.insert("label".into(), json!(case.label()));
            entry.insert("mb_per_s".into(), json!(s.mb_per_s));
            entry.insert("seconds".into(), json!(s.seconds));
            entry.insert("device_read_requests".into(), json!(s.requests));
            entry.insert("device_read_bytes".into(), json!(s.device_bytes));
            entry.insert("own_read_bytes".into(), json!(s.own_bytes));
            entry.insert("device_shared".into(), json!(s.disk_shared()));
            if let Some(rss) = s.daemon_peak_rss_kib {
                entry.insert("daemon_peak_rss_kib".into(), json!(rss));
            }
            if let Some(tree) = &s.tree {
                let counters: Map<String, Value> = tree
                    .iter()
                    .map(|(n, v)| (n.to_string(), json!(v)))
                    .collect();
                entry.insert("tree".into(), Value::Object(counters));
            }
            let runs: Vec<Value> = self
                .runs
                .iter()
                .filter_map(|r| r.seq.get(&case))
                .map(|s| {
                    json!({
                        "seconds": s.seconds,
                        "mb_per_s": mb_per_s(c.size, s.seconds),
                        "device_read_requests": s.device_read_requests,
                        "device_read_bytes": s.device_read_bytes,
                        "own_read_bytes": s.own_read_bytes,
                        "daemon_peak_rss_kib": s.daemon_peak_rss_kib,
                        "tree": s.tree.map(|t| t.fields().into_iter().map(|(n, v)| (n.to_string(), json!(v))).collect::<Map<_, _>>()),
                    })
                })
                .collect();
            entry.insert("runs".into(), Value::Array(runs));
            seq.insert(case.key().into(), Value::Object(entry));
        }
        let random_json = |r: &RandomSample| {
            json!({
                "verity_cold_us": r.verity_cold_us,
                "plain_cold_us": r.plain_cold_us,
                "verity_warm_us": r.verity_warm_us,
                "plain_warm_us": r.plain_warm_us,
                "verity_cold_device_read_requests": r.verity_cold_requests,
                "plain_cold_device_read_requests": r.plain_cold_requests,
            })
        };
        let mut random = random_json(&summary.random);
        random["runs"] = self.runs.iter().map(|r| random_json(&r.random)).collect();
        let ratios: Map<String, Value> = summary
            .ratios
            .iter()
            .map(|r| (r.key.to_string(), json!(r.value)))
            .collect();
        let ratios_per_run: Map<String, Value> = summary
            .ratios
            .iter()
            .map(|r| (r.key.to_string(), json!(r.per_run)))
            .collect();
        let targets: Map<String, Value> = summary
            .ratios
            .iter()
            .filter_map(|r| {
                let t = r.target?;
                Some((
                    r.key.to_string(),
                    json!({ "target": t.text(r.percent), "met": r.value.is_finite() && t.met(r.value) }),
                ))
            })
            .collect();
        let huge = self.huge.map(|h| {
            json!({
                "size_bytes": h.size,
                "seconds": h.seconds,
                "mb_per_s": mb_per_s(h.size, h.seconds),
                "daemon_rss_before_kib": h.rss_before_kib,
                "daemon_peak_rss_kib": h.peak_rss_kib,
            })
        });
        json!({
            "tool": "verityfs bench",
            "version": env!("CARGO_PKG_VERSION"),
            "config": {
                "dir": c.dir.display().to_string(),
                "size_bytes": c.size,
                "runs": c.runs,
                "cat_chunk_bytes": CAT_CHUNK,
                "library_chunk_bytes": LIBRARY_CHUNK,
                "random_reads": RANDOM_READS,
                "random_read_bytes": RANDOM_READ_SIZE,
                "random_seed": RANDOM_SEED,
            },
            "machine": {
                "cpu": self.cpu.0,
                "cpus": self.cpu.1,
                "kernel": self.kernel,
                "device": self.device,
                "load_average_start": self.load[0],
                "load_average_end": self.load[1],
            },
            "sequential": seq,
            "random_4k": random,
            "ratios": ratios,
            "ratios_per_run": ratios_per_run,
            "targets": targets,
            "huge": huge,
        })
    }

    /// Draws the PNG chart: sequential throughput on top, device requests
    /// and random read latency below.
    pub fn chart(&self, summary: &Summary, path: &Path) -> Result<()> {
        register_font()?;
        self.draw(summary, path)
            .ctx(format!("drawing the chart '{}'", path.display()))
    }

    fn draw(
        &self,
        summary: &Summary,
        path: &Path,
    ) -> std::result::Result<(), Box<dyn std::error::Error>> {
        let root = BitMapBackend::new(path, (1400, 980)).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.margin(10, 10, 10, 10);
        let (title, rest) = root.split_vertically(40);
        let c = &self.config;
        title.draw_text(
            &format!(
                "verityfs bench: cold reads of a {:.0} MB file, median of {} run{}",
                c.size as f64 / 1e6,
                c.runs,
                if c.runs == 1 { "" } else { "s" }
            ),
            &("sans-serif", 26).into_font().color(&BLACK),
            (0, 5),
        )?;
        let (rest, footer) = rest.split_vertically(rest.dim_in_pixel().1 - 30);
        let [load, _] = self.load;
        let mut foot = format!(
            "{} x {} | device {} | load average at start {:.2} {:.2} {:.2}",
            self.cpu.1, self.cpu.0, self.device, load[0], load[1], load[2]
        );
        if let Some(h) = &self.huge {
            let _ = write!(
                foot,
                " | {:.0} GiB sparse file: daemon peak RSS {:.1} MiB",
                h.size as f64 / (1u64 << 30) as f64,
                h.peak_rss_kib as f64 / 1024.0
            );
        }
        footer.draw_text(
            &foot,
            &("sans-serif", 15).into_font().color(&RGBColor(90, 90, 90)),
            (0, 8),
        )?;
        let (top, bottom) = rest.split_vertically(500);
        let (left, right) = bottom.split_horizontally(700);

        let bars: Vec<Bar> = Seq::ALL
            .iter()
            .map(|&case| {
                let s = &summary.seq[&case];
                Bar {
                    label: case.label().to_string(),
                    value: s.mb_per_s,
                    text: format!("{:.0}", s.mb_per_s),
                    color: case.color(),
                }
            })
            .collect();
        hbars(
            &top,
            "Sequential read throughput, MB/s (10^6 bytes/s)",
            &bars,
            330,
        )?;

        let plain_reqs = summary.seq[&Seq::MountPlain].requests;
        let cat_reqs = summary.seq[&Seq::PlainCat].requests;
        let bars: Vec<Bar> = [
            (Seq::PlainCat, f64::NAN),
            (Seq::MountPlain, f64::NAN),
            (Seq::MountVerityOn, plain_reqs),
            (Seq::MountVerityOff, plain_reqs),
            (Seq::LibraryOn, cat_reqs),
            (Seq::LibraryOff, cat_reqs),
        ]
        .iter()
        .map(|&(case, base)| {
            let reqs = summary.seq[&case].requests;
            let text = if base.is_nan() {
                format!("{reqs:.0}")
            } else {
                format!("{reqs:.0} ({:+.0}%)", (reqs / base - 1.0) * 100.0)
            };
            Bar {
                label: case.label().to_string(),
                value: reqs,
                text,
                color: case.color(),
            }
        })
        .collect();
        hbars(
            &left,
            "Device read requests (% over the plain read)",
            &bars,
            290,
        )?;

        let r = &summary.random;
        let (verity, plain) = (Seq::MountVerityOn.color(), Seq::MountPlain.color());
        let bars = vec![
            Bar::new(
                "verity, cold",
                r.verity_cold_us,
                format!("{:.0}", r.verity_cold_us),
                verity,
            ),
            Bar::new(
                "plain, cold",
                r.plain_cold_us,
                format!("{:.0}", r.plain_cold_us),
                plain,
            ),
            Bar::new(
                "verity, warm",
                r.verity_warm_us,
                format!("{:.1}", r.verity_warm_us),
                verity,
            ),
            Bar::new(
                "plain, warm",
                r.plain_warm_us,
                format!("{:.1}", r.plain_warm_us),
                plain,
            ),
        ];
        hbars(
            &right,
            &format!(
                "Random {} KiB reads through mount, mean µs",
                RANDOM_READ_SIZE / 1024
            ),
            &bars,
            130,
        )?;
        root.present()?;
        Ok(())
    }
}

/// Medians over `runs` and the ratios between them.
fn summarize(runs: &[Run], size: u64) -> Summary {
    let mut seq = BTreeMap::new();
    for case in Seq::ALL {
        let samples: Vec<&SeqSample> = runs.iter().filter_map(|r| r.seq.get(&case)).collect();
        let over = |f: &dyn Fn(&SeqSample) -> f64| median(samples.iter().map(|s| f(s)).collect());
        let tree = samples.first().and_then(|s| s.tree).map(|first| {
            first
                .fields()
                .into_iter()
                .enumerate()
                .map(|(i, (name, _))| {
                    let values = samples
                        .iter()
                        .filter_map(|s| s.tree.map(|t| t.fields()[i].1 as f64))
                        .collect();
                    (name, median(values))
                })
                .collect()
        });
        seq.insert(
            case,
            SeqSummary {
                mb_per_s: over(&|s| mb_per_s(size, s.seconds)),
                seconds: over(&|s| s.seconds),
                requests: over(&|s| s.device_read_requests as f64),
                device_bytes: over(&|s| s.device_read_bytes as f64),
                own_bytes: over(&|s| s.own_read_bytes as f64),
                daemon_peak_rss_kib: samples.iter().filter_map(|s| s.daemon_peak_rss_kib).max(),
                tree,
            },
        );
    }
    let random_over =
        |f: &dyn Fn(&RandomSample) -> f64| median(runs.iter().map(|r| f(&r.random)).collect());
    let random = RandomSample {
        verity_cold_us: random_over(&|r| r.verity_cold_us),
        plain_cold_us: random_over(&|r| r.plain_cold_us),
        verity_warm_us: random_over(&|r| r.verity_warm_us),
        plain_warm_us: random_over(&|r| r.plain_warm_us),
        verity_cold_requests: random_over(&|r| r.verity_cold_requests as f64) as u64,
        plain_cold_requests: random_over(&|r| r.plain_cold_requests as f64) as u64,
    };
    let speed = |a: Seq, b: Seq| seq[&a].mb_per_s / seq[&b].mb_per_s;
    let overhead = |a: Seq, b: Seq| (seq[&a].requests / seq[&b].requests - 1.0) * 100.0;
    let ratio = |key, label, value, target| Ratio {
        key,
        label,
        value,
        percent: false,
        target,
        per_run: Vec::new(),
    };
    let pct = |key, label, value, target| Ratio {
        key,
        label,
        value,
        percent: true,
        target,
        per_run: Vec::new(),
    };
    use Seq::*;
    let ratios = vec![
        ratio(
            "verified_vs_openssl",
            "verified read (mount) / openssl dgst -sha256",
            speed(MountVerityOn, Openssl),
            Some(Target::AtLeast(1.0)),
        ),
        ratio(
            "verified_vs_sha256sum",
            "verified read (mount) / sha256sum",
            speed(MountVerityOn, Sha256sum),
            None,
        ),
        ratio(
            "verified_vs_plain_cat",
            "verified read (mount) / plain cat",
            speed(MountVerityOn, PlainCat),
            Some(Target::AtLeast(0.6)),
        ),
        ratio(
            "verified_vs_mount_plain",
            "verified read / plain file, both through mount",
            speed(MountVerityOn, MountPlain),
            None,
        ),
        ratio(
            "readahead_speedup",
            "readahead on / off (mount)",
            speed(MountVerityOn, MountVerityOff),
            Some(Target::AtLeast(1.0)),
        ),
        pct(
            "tree_io_overhead_pct",
            "tree I/O overhead, readahead on (mount)",
            overhead(MountVerityOn, MountPlain),
            Some(Target::Below(10.0)),
        ),
        pct(
            "tree_io_overhead_pct_readahead_off",
            "tree I/O overhead, readahead off (mount)",
            overhead(MountVerityOff, MountPlain),
            None,
        ),
        ratio(
            "library_verified_vs_openssl",
            "library verified read / openssl dgst -sha256",
            speed(LibraryOn, Openssl),
            Some(Target::AtLeast(1.0)),
        ),
        ratio(
            "library_readahead_speedup",
            "library readahead on / off",
            speed(LibraryOn, LibraryOff),
            Some(Target::AtLeast(1.0)),
        ),
        pct(
            "library_tree_io_overhead_pct",
            "library tree I/O overhead vs plain cat, ra on",
            overhead(LibraryOn, PlainCat),
            Some(Target::Below(10.0)),
        ),
        pct(
            "library_tree_io_overhead_pct_readahead_off",
            "library tree I/O overhead vs plain cat, ra off",
            overhead(LibraryOff, PlainCat),
            None,
        ),
        ratio(
            "random_cold_latency_ratio",
            "random 4 KiB cold latency, verity / plain",
            random.verity_cold_us / random.plain_cold_us,
            Some(Target::AtMost(1.3)),
        ),
        ratio(
            "random_warm_latency_ratio",
            "random 4 KiB warm latency, verity / plain",
            random.verity_warm_us / random.plain_warm_us,
            None,
        ),
    ];
    Summary {
        seq,
        random,
        ratios,
    }
}

/// One bar of a chart.
struct Bar {
    label: String,
    value: f64,
    text: String,
    color: RGBColor,
}

impl Bar {
    fn new(label: &str, value: f64, text: String, color: RGBColor) -> Bar {
        Bar {
            label: label.to_string(),
            value,
            text,
            color,
        }
    }
}

/// A horizontal bar chart, first bar on top, values written after the bars.
fn hbars<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    caption: &str,
    bars: &[Bar],
    label_width: u32,
) -> std::result::Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let n = bars.len();
    let max = bars
        .iter()
        .map(|b| b.value)
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let max = if max > 0.0 { max * 1.3 } else { 1.0 };
    let decimals = if max < 10.0 { 1 } else { 0 };
    let row = |i: usize| n - 1 - i;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(label_width)
        .build_cartesian_2d(0f64..max, (0..n - 1).into_segmented())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .light_line_style(TRANSPARENT)
        .x_label_formatter(&|v| format!("{v:.decimals$}"))
        .y_labels(n)
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) if *i < n => bars[row(*i)].label.clone(),
            _ => String::new(),
        })
        .x_labels(6)
        .label_style(("sans-serif", 15))
        .draw()?;
    chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
        let y = row(i);
        let value = if b.value.is_finite() { b.value } else { 0.0 };
        let mut rect = Rectangle::new(
            [
                (0.0, SegmentValue::Exact(y)),
                (value, SegmentValue::Exact(y + 1)),
            ],
            b.color.filled(),
        );
        rect.set_margin(5, 5, 0, 0);
        rect
    }))?;
    let style = ("sans-serif", 15)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
        let value = if b.value.is_finite() { b.value } else { 0.0 };
        Text::new(
            format!(" {}", b.text),
            (value, SegmentValue::CenterOf(row(i))),
            style.clone(),
        )
    }))?;
    Ok(())
}

/// TrueType fonts tried for the chart's text, in order.
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
];

/// Registers a system font as plotters' "sans-serif" (once per process).
fn register_font() -> Result<()> {
    static REGISTERED: OnceLock<Result<()>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let bytes = FONTS
                .iter()
                .find_map(|path| std::fs::read(path).ok())
                .ok_or_else(|| {
                    format!(
                        "no font for the chart's text (looked for {}); \
                         install Debian's fonts-dejavu-core",
                        FONTS.join(", ")
                    )
                })?;
            // plotters keeps fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| "the chart's font file is not a valid TrueType font".to_string())
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
    }

    #[test]
    fn targets() {
        assert!(Target::AtLeast(1.0).met(1.0));
        assert!(!Target::Below(10.0).met(10.0));
        assert!(Target::AtMost(1.3).met(1.3));
        assert_eq!(Target::Below(10.0).text(true), "< 10%");
        assert_eq!(Target::AtLeast(0.6).text(false), ">= 0.6x");
    }
}
