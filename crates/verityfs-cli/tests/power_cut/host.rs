//! On the host: the campaign. Each cut is one boot of the VM that first
//! checks what the previous cut left, then runs the next workload until
//! QEMU is killed; a last boot checks the last cut.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{SystemTime, UNIX_EPOCH};

use fastrand::Rng;

use crate::common::{digest, random_bytes, run_ok, VERITYFS};
use crate::plan::{Acks, Plan, VerityFile, ACKS, CHECK_ACKS, CHECK_PLAN, PLAN, REPORT};

/// The cut count when `VERITYFS_POWER_CUTS` is not set: a few minutes.
const DEFAULT_CUTS: usize = 3;
/// Boots tried before a VM that crashes at boot fails the test.
const MAX_BOOT_ATTEMPTS: usize = 3;

/// The power goes at most this many seconds after the step the plan
/// picked: past ext4's 5-second commit interval, so that metadata an fsync
/// forgot is lost, and into the next step or two.
const CUT_WINDOW_MS: u64 = 12_000;

pub fn run() {
    let cuts = env_number("VERITYFS_POWER_CUTS").unwrap_or(DEFAULT_CUTS as u64) as usize;
    let seed = env_number("VERITYFS_POWER_CUT_SEED").unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    println!("power_cut: {cuts} cuts, VERITYFS_POWER_CUT_SEED={seed}");
    let campaign = Campaign::new();
    let mut rng = Rng::with_seed(seed);
    let mut tally = BTreeMap::<(&str, String), usize>::new();
    let mut checked: Option<(Plan, String)> = None;
    for cut in 0..=cuts {
        let plan = (cut < cuts).then(|| Plan::random(&mut rng, cut, |f| campaign.digest(f)));
        let delay = rng.u64(..CUT_WINDOW_MS) as f64 / 1000.0;
        let out = campaign.boot(plan.as_ref(), checked.as_ref(), delay);
        if let Some((plan, acks)) = &checked {
            judge(&campaign, cut - 1, plan, acks, &out, &mut tally);
        }
        let expected = if plan.is_some() { 137 } else { 0 };
        assert_eq!(
            out.status.code(),
            Some(expected),
            "the VM run did not end as expected (137: power cut; 0: checks passed; \
             124: timeout; 125: the VM could not boot or run the guest):\n{}",
            describe(&out)
        );
        checked = plan.map(|plan| {
            let acks = fs::read_to_string(campaign.io.join(ACKS)).unwrap_or_default();
            let a = Acks::decode(&acks);
            println!(
                "cut {cut}: power cut {delay:.2}s after step {} ({} writes, {} enables acknowledged)",
                plan.cut_step,
                a.synced.len(),
                a.enabled.len()
            );
            (plan, acks)
        });
    }
    print_tally(cuts, &tally);
    campaign.remove();
}

/// Reads the guest's report on cut `cut`, counts its outcomes, and fails
/// on any failure it lists.
fn judge(
    campaign: &Campaign,
    cut: usize,
    plan: &Plan,
    acks: &str,
    out: &Output,
    tally: &mut BTreeMap<(&'static str, String), usize>,
) {
    let report = fs::read_to_string(campaign.io.join(REPORT))
        .unwrap_or_else(|e| panic!("no report of the checks: {e}; guest: {}", describe(out)));
    println!(
        "  after cut {cut}: {}",
        report.trim_end().replace('\n', ", ")
    );
    tally_report(tally, plan, &Acks::decode(acks), &report);
    let failures: Vec<&str> = report.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert!(
        failures.is_empty(),
        "after cut {cut}: {failures:#?}\nacknowledged: {acks}\nplan: {plan:#?}\n\
         (disk image and shared directory kept in {:?})",
        campaign.dir
    );
}

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?}: not a number")),
    )
}

/// The campaign's directory: the disk image, the directory shared with
/// the guest and copies of the programs (so that a rebuild meanwhile does
/// not change what runs).
struct Campaign {
    dir: PathBuf,
    io: PathBuf,
    disk: PathBuf,
    guest: PathBuf,
    verityfs: PathBuf,
}

impl Campaign {
    fn new() -> Campaign {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("power-cut-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let campaign = Campaign {
            io: dir.join("io"),
            disk: dir.join("disk.img"),
            guest: dir.join("guest"),
            verityfs: dir.join("verityfs"),
            dir,
        };
        fs::create_dir_all(&campaign.io).unwrap();
        fs::copy(std::env::current_exe().unwrap(), &campaign.guest).unwrap();
        let program = std::env::var_os("VERITYFS_POWER_CUT_BIN").unwrap_or(VERITYFS.into());
        fs::copy(&program, &campaign.verityfs)
            .unwrap_or_else(|e| panic!("copying {program:?}: {e}"));
        run_ok(
            Command::new("truncate")
                .args(["-s", "1G"])
                .arg(&campaign.disk),
        );
        run_ok(
            Command::new("mkfs.ext4")
                .args(["-q", "-F", "-b", "4096"])
                .arg(&campaign.disk),
        );
        campaign
    }

    /// `fsverity digest` of a file's data, computed here.
    fn digest(&self, file: &VerityFile) -> String {
        let path = self.dir.join("digest-input");
        fs::write(&path, random_bytes(file.size, file.seed)).unwrap();
        let params = file.params();
        let params: Vec<&str> = params.iter().map(String::as_str).collect();
        let digest = digest(&path, &params);
        fs::remove_file(&path).unwrap();
        digest
    }

    /// One boot: checks `checked` (a plan and what was acknowledged of it),
    /// then runs `plan`, killed `delay` seconds after its cut step (which
    /// the caller checks: 137).
    fn boot(&self, plan: Option<&Plan>, checked: Option<&(Plan, String)>, delay: f64) -> Output {
        for name in [PLAN, CHECK_PLAN, CHECK_ACKS, ACKS, REPORT] {
            let _ = fs::remove_file(self.io.join(name));
        }
        if let Some(plan) = plan {
            fs::write(self.io.join(PLAN), plan.encode()).unwrap();
        }
        if let Some((plan, acks)) = checked {
            fs::write(self.io.join(CHECK_PLAN), plan.encode()).unwrap();
            fs::write(self.io.join(CHECK_ACKS), acks).unwrap();
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kernel-oracle.sh");
        let mut cmd = Command::new(script);
        cmd.arg("--out").arg(&self.io);
        cmd.arg("--scratch-image").arg(self.dir.join("scratch.img"));
        // Writethrough: the guest sees a disk without a volatile cache, and
        // a write completes only once it is in the image file (O_DSYNC),
        // so killing QEMU loses exactly what the guest had not written.
        cmd.arg("--drive")
            .arg(format!("{},cache=writethrough", self.disk.display()));
        cmd.args([
            "--timeout",
            "1200",
            "--env",
            "VERITYFS_POWER_CUT_ROLE=guest",
        ]);
        cmd.arg("--env").arg(format!(
            "VERITYFS_POWER_CUT_BIN={}",
            self.verityfs.display()
        ));
        if plan.is_some() {
            cmd.args(["--kill-after", &format!("{delay:.3}")]);
        }
        cmd.arg("--").arg(&self.guest);
        self.run_vm(&mut cmd)
    }

    /// Runs the VM, again if its kernel crashed before the guest's program
    /// started (the disk untouched): emulation on a loaded machine
    /// sometimes panics at boot. Fails on the third such crash.
    fn run_vm(&self, cmd: &mut Command) -> Output {
        for attempt in 1.. {
            let out = cmd
                .output()
                .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
            let crashed_at_boot =
                out.status.code() == Some(125) && !self.io.join("booted").exists();
            if !crashed_at_boot || attempt == MAX_BOOT_ATTEMPTS {
                return out;
            }
            let console = fs::read_to_string(self.io.join("console.log")).unwrap_or_default();
            let last = console
                .lines()
                .rev()
                .find(|l| l.contains("panic"))
                .unwrap_or("");
            println!("  the VM crashed before the guest started ({last}); booting again");
        }
        unreachable!()
    }

    fn remove(&self) {
        fs::remove_dir_all(&self.dir).unwrap();
    }
}

fn describe(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Counts outcomes by how far each file had got when the power went.
fn tally_report(
    tally: &mut BTreeMap<(&'static str, String), usize>,
    plan: &Plan,
    acks: &Acks,
    report: &str,
) {
    for line in report.lines() {
        let mut words = line.split_whitespace();
        let (outcome, name) = (words.next().unwrap(), words.next().unwrap());
        let stage = if plan.log.as_ref().is_some_and(|(log, _)| log == name) {
            "appended log"
        } else if acks.enabled.iter().any(|n| n == name) {
            "enable acknowledged"
        } else if acks.synced.iter().any(|n| n == name) {
            "written, enable not acknowledged"
        } else {
            "write not acknowledged"
        };
        *tally.entry((stage, outcome.to_owned())).or_default() += 1;
    }
}

fn print_tally(cuts: usize, tally: &BTreeMap<(&str, String), usize>) {
    println!("power_cut: {cuts} cuts, outcomes by file:");
    for ((stage, outcome), count) in tally {
        println!("  {stage:34} {outcome:8} {count}");
    }
}
