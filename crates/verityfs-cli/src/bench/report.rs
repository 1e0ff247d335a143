//! What a benchmark found: the samples of every run, their medians and the
//! ratios of the verity file to the plain file measured in the same run,
//! printed as a table, written as JSON and drawn as a PNG chart.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::{json, Map, Value};

use super::files::{Sizes, SMALL_FILE_SIZE};
use super::measure::{median, CAT_CHUNK, LIBRARY_CHUNK, RANDOM_READ_SIZE, RANDOM_SEED};
use super::workloads::{Sample, Variant, Workload, HOGS};
use super::{Config, Context, Result};

/// The samples of one run.
pub type Run = BTreeMap<(Workload, Variant), Sample>;

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
    /// The test files' sizes.
    pub sizes: Sizes,
    /// The device counted (its kernel name).
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

/// Medians of one workload read one way, over the runs.
#[derive(Clone, Debug, Default)]
pub struct Medians {
    /// Seconds.
    pub seconds: f64,
    /// Bytes read by the workload.
    pub bytes: f64,
    /// MB/s (10^6 bytes per second).
    pub mb_per_s: f64,
    /// Device read requests.
    pub requests: f64,
    /// 512-byte sectors read from the device.
    pub sectors: f64,
    /// Bytes our processes read from storage.
    pub own_bytes: f64,
    /// Median, mean and 99th percentile latency of single reads, µs.
    pub latency: Option<[f64; 3]>,
    /// Highest daemon peak RSS, KiB.
    pub daemon_peak_rss_kib: Option<u64>,
    /// Daemon CPU seconds.
    pub daemon_cpu_seconds: Option<f64>,
    /// The whole machine's CPU seconds.
    pub machine_cpu_seconds: f64,
    /// Each read path counter (library reads).
    pub tree: Option<Vec<(&'static str, f64)>>,
}

impl Medians {
    /// Whether the device read noticeably more than our processes: other
    /// programs read from it during the measurement, so the request count
    /// is an overestimate.
    pub fn disk_shared(&self) -> bool {
        self.sectors * 512.0 > self.own_bytes * 1.05 + 256.0 * 1024.0
    }

    fn of(samples: &[&Sample]) -> Medians {
        let over = |f: &dyn Fn(&Sample) -> f64| median(samples.iter().map(|s| f(s)).collect());
        let latency = samples.first().and_then(|s| s.latency).map(|_| {
            let of = |f: &dyn Fn(&Sample) -> f64| {
                median(
                    samples
                        .iter()
                        .filter(|s| s.latency.is_some())
                        .map(|s| f(s))
                        .collect(),
                )
            };
            [
                of(&|s| s.latency.map_or(f64::NAN, |l| l.median_us)),
                of(&|s| s.latency.map_or(f64::NAN, |l| l.mean_us)),
                of(&|s| s.latency.map_or(f64::NAN, |l| l.p99_us)),
            ]
        });
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
        Medians {
            seconds: over(&|s| s.seconds),
            bytes: over(&|s| s.bytes as f64),
            mb_per_s: over(&|s| s.bytes as f64 / s.seconds / 1e6),
            requests: over(&|s| s.device_read_requests as f64),
            sectors: over(&|s| s.device_read_sectors as f64),
            own_bytes: over(&|s| s.own_read_bytes as f64),
            latency,
            daemon_peak_rss_kib: samples.iter().filter_map(|s| s.daemon_peak_rss_kib).max(),
            daemon_cpu_seconds: samples
                .iter()
                .all(|s| s.daemon_cpu_seconds.is_some())
                .then(|| over(&|s| s.daemon_cpu_seconds.unwrap_or(f64::NAN))),
            machine_cpu_seconds: over(&|s| s.machine_cpu_seconds),
            tree,
        }
    }

    fn json(&self, variant: Variant) -> Value {
        let mut entry = json!({
            "label": variant.label(),
            "seconds": self.seconds,
            "bytes": self.bytes,
            "mb_per_s": self.mb_per_s,
            "device_read_requests": self.requests,
            "device_read_sectors": self.sectors,
            "device_read_bytes": self.sectors * 512.0,
            "own_read_bytes": self.own_bytes,
            "device_shared": self.disk_shared(),
            "machine_cpu_seconds": self.machine_cpu_seconds,
        });
        if let Some([median_us, mean_us, p99_us]) = self.latency {
            entry["latency_us"] = json!({ "median": median_us, "mean": mean_us, "p99": p99_us });
        }
        if let Some(rss) = self.daemon_peak_rss_kib {
            entry["daemon_peak_rss_kib"] = json!(rss);
        }
        if let Some(cpu) = self.daemon_cpu_seconds {
            entry["daemon_cpu_seconds"] = json!(cpu);
        }
        if let Some(tree) = &self.tree {
            entry["tree"] = tree
                .iter()
                .map(|(n, v)| (n.to_string(), json!(v)))
                .collect();
        }
        entry
    }
}

/// What a ratio divides.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Quantity {
    Time,
    Requests,
    Sectors,
    MedianLatency,
}

impl Quantity {
    fn key(self) -> &'static str {
        match self {
            Quantity::Time => "time",
            Quantity::Requests => "requests",
            Quantity::Sectors => "sectors",
            Quantity::MedianLatency => "median_latency",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Quantity::Time => "time",
            Quantity::Requests => "device requests",
            Quantity::Sectors => "sectors",
            Quantity::MedianLatency => "median latency",
        }
    }

    fn of(self, m: &Medians) -> f64 {
        match self {
            Quantity::Time => m.seconds,
            Quantity::Requests => m.requests,
            Quantity::Sectors => m.sectors,
            Quantity::MedianLatency => m.latency.map_or(f64::NAN, |l| l[0]),
        }
    }
}

/// One ratio: `quantity` of `of` over that of `over`, in one workload.
#[derive(Clone, Debug)]
pub struct Ratio {
    of: Variant,
    over: Variant,
    quantity: Quantity,
    /// The ratio of the medians (NaN if the divisor is 0).
    pub value: f64,
    /// The same ratio within each run alone.
    pub per_run: Vec<f64>,
}

impl Ratio {
    /// Its JSON key, e.g. `time_verity_mount_vs_plain_direct`.
    pub fn key(&self) -> String {
        format!(
            "{}_{}_vs_{}",
            self.quantity.key(),
            self.of.key(),
            self.over.key()
        )
    }
}

/// The ratios a workload reports: the verity file through the mount over
/// each plain anchor, and for the sequential read over the hashing tools,
/// plus the library's read over the plain file.
fn ratio_pairs(workload: Workload) -> Vec<(Variant, Variant, Quantity)> {
    use Quantity::*;
    use Variant::*;
    let mut pairs = Vec::new();
    for over in [PlainMount, PlainDirect] {
        pairs.extend([Time, Requests, Sectors].map(|q| (VerityMount, over, q)));
        if workload == Workload::Random {
            pairs.push((VerityMount, over, MedianLatency));
        }
    }
    if workload == Workload::Seq {
        pairs.push((VerityMount, Sha256sum, Time));
        pairs.push((VerityMount, Openssl, Time));
        pairs.extend([Time, Requests].map(|q| (VerityLibrary, PlainDirect, q)));
    }
    pairs
}

/// The medians and ratios of some runs.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Per workload and way of reading.
    pub medians: BTreeMap<(Workload, Variant), Medians>,
    /// Per workload, in table order.
    pub ratios: BTreeMap<Workload, Vec<Ratio>>,
}

impl Summary {
    fn of(runs: &[Run], workloads: &[Workload]) -> Summary {
        let mut summary = Summary::default();
        for &workload in workloads {
            for &variant in workload.variants() {
                let samples: Vec<&Sample> = runs
                    .iter()
                    .filter_map(|r| r.get(&(workload, variant)))
                    .collect();
                summary
                    .medians
                    .insert((workload, variant), Medians::of(&samples));
            }
            let ratios = ratio_pairs(workload)
                .into_iter()
                .map(|(of, over, quantity)| {
                    let get = |v| quantity.of(&summary.medians[&(workload, v)]);
                    Ratio {
                        of,
                        over,
                        quantity,
                        value: get(of) / get(over),
                        per_run: Vec::new(),
                    }
                })
                .collect();
            summary.ratios.insert(workload, ratios);
        }
        summary
    }
}

/// The summary of all runs, and that of each run alone.
pub struct Summaries {
    /// Over all runs.
    pub all: Summary,
    /// Each run alone, in order.
    pub each: Vec<Summary>,
}

impl Report {
    /// Medians and ratios over the runs, and per run.
    pub fn summary(&self) -> Summaries {
        let workloads = &self.config.workloads;
        let mut all = Summary::of(&self.runs, workloads);
        let each: Vec<Summary> = self
            .runs
            .iter()
            .map(|run| Summary::of(std::slice::from_ref(run), workloads))
            .collect();
        for (workload, ratios) in &mut all.ratios {
            for (i, ratio) in ratios.iter_mut().enumerate() {
                ratio.per_run = each.iter().map(|s| s.ratios[workload][i].value).collect();
            }
        }
        Summaries { all, each }
    }

    /// The table printed on stdout.
    pub fn table(&self, summaries: &Summaries) -> String {
        let summary = &summaries.all;
        let c = &self.config;
        let mut t = String::new();
        let _ = writeln!(
            t,
            "verityfs bench: median of {} run{}, cold cache unless noted",
            c.runs,
            if c.runs == 1 { "" } else { "s" }
        );
        let [start, end] = self.load;
        let _ = writeln!(
            t,
            "machine: {} x {}, kernel {}",
            self.cpu.1, self.cpu.0, self.kernel
        );
        let _ = writeln!(t, "device: {}", self.device_text());
        let _ = writeln!(
            t,
            "load average: {:.2} {:.2} {:.2} at start, {:.2} {:.2} {:.2} at end",
            start[0], start[1], start[2], end[0], end[1], end[2]
        );
        let mut shared = false;
        for &workload in &c.workloads {
            let _ = writeln!(t);
            let _ = writeln!(t, "{}", workload.title(&self.sizes, c.reads));
            let _ = writeln!(
                t,
                "  {:<40} {:>8} {:>8} {:>9} {:>10}  notes",
                "", "s", "MB/s", "dev reqs", "sectors"
            );
            for &variant in workload.variants() {
                let m = &summary.medians[&(workload, variant)];
                let mark = if m.disk_shared() {
                    shared = true;
                    "*"
                } else {
                    ""
                };
                let _ = writeln!(
                    t,
                    "  {:<40} {:>8.3} {:>8.1} {:>9} {:>10}{mark:1} {}",
                    variant.label(),
                    m.seconds,
                    m.mb_per_s,
                    m.requests,
                    m.sectors,
                    notes(m)
                );
            }
            ratio_lines(&mut t, &summary.ratios[&workload]);
        }
        if shared {
            let _ = writeln!(
                t,
                "\n* the device read more than our processes did: other programs used it meanwhile, \
                 and its request count includes theirs"
            );
        }
        if let Some(h) = &self.huge {
            let _ = writeln!(t);
            let _ = writeln!(
                t,
                "{} GiB sparse verity file through mount: {:.1} MB/s, daemon RSS {:.1} MiB mounted, peak {:.1} MiB",
                h.size as f64 / (1u64 << 30) as f64,
                h.size as f64 / h.seconds / 1e6,
                h.rss_before_kib as f64 / 1024.0,
                h.peak_rss_kib as f64 / 1024.0
            );
        }
        t
    }

    fn device_text(&self) -> String {
        if self.config.dir_device {
            format!(
                "{} (the disk holding {}; other programs' reads of it are counted too)",
                self.device,
                self.config.dir.display()
            )
        } else {
            format!(
                "{} (ext4 on a loop device made for this run, its image in {})",
                self.device,
                self.config.dir.display()
            )
        }
    }

    /// The JSON document: per workload, each way of reading with its
    /// medians and every run's sample, and the ratios.
    pub fn json(&self, summaries: &Summaries) -> Value {
        let c = &self.config;
        let mut workloads = Map::new();
        for &workload in &c.workloads {
            let mut variants = Map::new();
            for &variant in workload.variants() {
                let key = (workload, variant);
                let mut entry = summaries.all.medians[&key].json(variant);
                entry["runs"] = summaries
                    .each
                    .iter()
                    .map(|s| {
                        let mut run = s.medians[&key].json(variant);
                        run.as_object_mut().map(|o| o.remove("label"));
                        run
                    })
                    .collect();
                variants.insert(variant.key().into(), entry);
            }
            let ratios = &summaries.all.ratios[&workload];
            workloads.insert(
                workload.key().into(),
                json!({
                    "title": workload.title(&self.sizes, c.reads),
                    "bytes": workload.bytes(&self.sizes, c.reads),
                    "cold_cache": workload.cold(),
                    "variants": variants,
                    "ratios": ratios.iter().map(|r| (r.key(), json!(r.value))).collect::<Map<_, _>>(),
                    "ratios_per_run": ratios.iter().map(|r| (r.key(), json!(r.per_run))).collect::<Map<_, _>>(),
                }),
            );
        }
        let huge = self.huge.map(|h| {
            json!({
                "size_bytes": h.size,
                "seconds": h.seconds,
                "mb_per_s": h.size as f64 / h.seconds / 1e6,
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
                "files": c.files,
                "file_bytes": SMALL_FILE_SIZE,
                "stream_bytes": self.sizes.stream,
                "random_reads": c.reads,
                "random_read_bytes": RANDOM_READ_SIZE,
                "random_seed": RANDOM_SEED,
                "cpu_hogs": HOGS,
                "runs": c.runs,
                "workloads": c.workloads.iter().map(|w| w.key()).collect::<Vec<_>>(),
                "loop_device": !c.dir_device,
                "cat_chunk_bytes": CAT_CHUNK,
                "library_chunk_bytes": LIBRARY_CHUNK,
            },
            "machine": {
                "cpu": self.cpu.0,
                "cpus": self.cpu.1,
                "kernel": self.kernel,
                "device": self.device,
                "load_average_start": self.load[0],
                "load_average_end": self.load[1],
            },
            "workloads": workloads,
            "huge": huge,
        })
    }

    /// Draws the PNG chart: every workload's ratios of time and of device
    /// requests, and the sequential read's throughput with its anchors.
    pub fn chart(&self, summaries: &Summaries, path: &Path) -> Result<()> {
        register_font()?;
        self.draw(&summaries.all, path)
            .ctx(format!("drawing the chart '{}'", path.display()))
    }

    fn draw(
        &self,
        summary: &Summary,
        path: &Path,
    ) -> std::result::Result<(), Box<dyn std::error::Error>> {
        let root = BitMapBackend::new(path, (1400, 1150)).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.margin(10, 10, 10, 10);
        let (title, rest) = root.split_vertically(40);
        let c = &self.config;
        title.draw_text(
            &format!(
                "verityfs bench: the verity file through the mount against the plain file, median of {} run{}",
                c.runs,
                if c.runs == 1 { "" } else { "s" }
            ),
            &("sans-serif", 24).into_font().color(&BLACK),
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
        let (top, bottom) = rest.split_vertically(640);
        let (left, right) = top.split_horizontally(700);
        for (area, quantity, caption) in [
            (&left, Quantity::Time, "Time, verity / plain (1 = same)"),
            (
                &right,
                Quantity::Requests,
                "Device read requests, verity / plain",
            ),
        ] {
            hbars(area, caption, &self.ratio_bars(summary, quantity), 210)?;
        }
        if c.workloads.contains(&Workload::Seq) {
            let bars: Vec<Bar> = Workload::Seq
                .variants()
                .iter()
                .map(|&v| {
                    let mb = summary.medians[&(Workload::Seq, v)].mb_per_s;
                    Bar::new(v.label(), mb, format!("{mb:.0}"), color(v))
                })
                .collect();
            hbars(
                &bottom,
                "Sequential read, cold cache, MB/s (10^6 bytes/s)",
                &bars,
                330,
            )?;
        }
        root.present()?;
        Ok(())
    }

    /// Two bars per workload: the verity file through the mount over the
    /// plain file through the mount and over the plain file read directly.
    fn ratio_bars(&self, summary: &Summary, quantity: Quantity) -> Vec<Bar> {
        let mut bars = Vec::new();
        for &workload in &self.config.workloads {
            for (over, name) in [
                (Variant::PlainMount, "mount"),
                (Variant::PlainDirect, "direct"),
            ] {
                let value = summary.ratios[&workload]
                    .iter()
                    .find(|r| {
                        r.of == Variant::VerityMount && r.over == over && r.quantity == quantity
                    })
                    .map_or(f64::NAN, |r| r.value);
                bars.push(Bar::new(
                    &format!("{}, vs {name}", workload.short()),
                    value,
                    times(value),
                    color(over),
                ));
            }
        }
        bars
    }
}

/// The colour of a way of reading in the chart (that of the anchor, in the
/// ratio charts).
fn color(variant: Variant) -> RGBColor {
    match variant {
        Variant::PlainDirect => RGBColor(128, 128, 128),
        Variant::Sha256sum | Variant::Openssl => RGBColor(180, 180, 180),
        Variant::PlainMount => RGBColor(70, 130, 180),
        Variant::VerityMount => RGBColor(34, 139, 34),
        Variant::VerityLibrary => RGBColor(102, 205, 170),
    }
}

/// A ratio as `1.23x`, or `n/a` when it has no value (nothing to divide by).
fn times(value: f64) -> String {
    if value.is_finite() {
        format!("{value:.2}x")
    } else {
        "n/a".into()
    }
}

/// A ratio's short name for a way of reading.
fn ratio_name(variant: Variant) -> &'static str {
    match variant {
        Variant::PlainDirect => "plain read directly",
        Variant::Sha256sum => "sha256sum",
        Variant::Openssl => "openssl dgst -sha256",
        Variant::PlainMount => "plain through the mount",
        Variant::VerityMount => "verity through the mount",
        Variant::VerityLibrary => "library verified read",
    }
}

/// The notes column of a table row.
fn notes(m: &Medians) -> String {
    let mut notes = Vec::new();
    if let Some([median_us, mean_us, p99_us]) = m.latency {
        notes.push(format!(
            "latency median {median_us:.0} us, mean {mean_us:.0} us, p99 {p99_us:.0} us"
        ));
    }
    if let Some(rss) = m.daemon_peak_rss_kib {
        notes.push(format!("daemon peak RSS {:.1} MiB", rss as f64 / 1024.0));
    }
    if let Some(cpu) = m.daemon_cpu_seconds {
        notes.push(format!("daemon CPU {:.0} ms", cpu * 1e3));
    }
    notes.push(format!("machine CPU {:.0} ms", m.machine_cpu_seconds * 1e3));
    if let Some(tree) = &m.tree {
        let get = |name| {
            tree.iter()
                .find(|(n, _)| *n == name)
                .map_or(f64::NAN, |f| f.1)
        };
        notes.push(format!(
            "tree: {} reqs, {} blocks, {} readahead reqs",
            get("tree_read_requests"),
            get("tree_blocks_read"),
            get("readahead_requests")
        ));
    }
    notes.join("; ")
}

/// The ratio lines of a workload: one per pair of ways of reading.
fn ratio_lines(t: &mut String, ratios: &[Ratio]) {
    let mut i = 0;
    while i < ratios.len() {
        let (of, over) = (ratios[i].of, ratios[i].over);
        let same: Vec<&Ratio> = ratios[i..]
            .iter()
            .take_while(|r| (r.of, r.over) == (of, over))
            .collect();
        let values: Vec<String> = same
            .iter()
            .map(|r| format!("{} {}", r.quantity.label(), times(r.value)))
            .collect();
        let _ = writeln!(
            t,
            "  {} / {}: {}",
            ratio_name(of),
            ratio_name(over),
            values.join(", ")
        );
        i += same.len();
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
    fn ratio_keys_and_text() {
        let pairs = ratio_pairs(Workload::Seq);
        assert!(pairs.contains(&(Variant::VerityMount, Variant::Openssl, Quantity::Time)));
        let r = Ratio {
            of: Variant::VerityMount,
            over: Variant::PlainDirect,
            quantity: Quantity::Requests,
            value: 1.0,
            per_run: vec![],
        };
        assert_eq!(r.key(), "requests_verity_mount_vs_plain_direct");
        assert_eq!(times(1.234), "1.23x");
        assert_eq!(times(f64::NAN), "n/a");
    }
}
