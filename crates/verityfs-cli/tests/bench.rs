//! `verityfs bench` end to end with small sizes: every workload is in the
//! JSON report with plausible figures counted on the benchmark's own loop
//! device, the chart is a PNG, and the scratch files, mounts and loop device
//! are gone afterwards, also after Ctrl-C. Needs root (it drops caches,
//! sets up a loop device and mounts FUSE) and `/dev/fuse`; fails without
//! them.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_verityfs");

/// Fails, saying what is missing, unless the bench can run here.
fn require_root_and_fuse() {
    let euid = rustix::process::geteuid().as_raw();
    assert_eq!(
        euid, 0,
        "verityfs bench needs root (it drops caches, sets up a loop device and mounts FUSE); \
         running as uid {euid}"
    );
    let fuse = std::fs::metadata("/dev/fuse");
    assert!(
        fuse.as_ref().is_ok_and(|m| m.file_type().is_char_device()),
        "verityfs bench needs /dev/fuse (a character device): {fuse:?}"
    );
}

/// A directory on the disk, under target/: /tmp may be a tmpfs.
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn number(v: &Value, path: &str) -> f64 {
    let mut at = v;
    for key in path.split('.') {
        at = &at[key];
    }
    at.as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number: {at}"))
}

fn positive(v: &Value, path: &str) {
    let n = number(v, path);
    assert!(n > 0.0 && n.is_finite(), "{path} = {n}, want > 0");
}

/// One bench at a time: each drops the caches, which would empty the
/// page cache under another's warm reread.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `verityfs bench --dir=DIR ARGS...`; returns stdout and the JSON.
fn bench(dir: &Path, args: &[&str]) -> (String, Value) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new(BIN)
        .arg("bench")
        .arg(format!("--dir={}", dir.display()))
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    // Shown if an assertion below fails.
    println!("{stdout}");
    let json: Value =
        serde_json::from_slice(&std::fs::read(dir.join("bench.json")).unwrap()).unwrap();
    println!("{json:#}");
    assert_cleaned_up(dir);
    (stdout, json)
}

/// Nothing of the run is left in `dir` but the outputs: no scratch
/// directory, no mount, no loop device on an image there.
fn assert_cleaned_up(dir: &Path) {
    let mut left: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with("bench."))
        .collect();
    left.sort();
    assert!(left.is_empty(), "left in {}: {left:?}", dir.display());
    let dir_text = dir.to_string_lossy().into_owned();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mountinfo.contains(&dir_text), "left mounted in {dir_text}");
    for entry in std::fs::read_dir("/sys/block").unwrap() {
        let backing = entry.unwrap().path().join("loop/backing_file");
        let file = std::fs::read_to_string(&backing).unwrap_or_default();
        assert!(
            !file.starts_with(&dir_text),
            "{}: {file}",
            backing.display()
        );
    }
}

/// The ways each workload is read.
fn variants(workload: &str) -> &'static [&'static str] {
    match workload {
        "seq" => &[
            "plain_direct",
            "sha256sum",
            "openssl_dgst_sha256",
            "plain_mount",
            "verity_mount",
            "verity_library",
        ],
        _ => &["plain_direct", "plain_mount", "verity_mount"],
    }
}

const WORKLOADS: [&str; 8] = [
    "small",
    "random",
    "seq",
    "parallel4",
    "parallel16",
    "parallel_same4",
    "busy",
    "warm",
];

/// Checks one workload's figures.
fn check_workload(json: &Value, key: &str) {
    let w = &json["workloads"][key];
    let bytes = number(w, "bytes");
    assert!(bytes > 0.0, "{key}");
    let cold = w["cold_cache"].as_bool().unwrap();
    assert_eq!(cold, key != "warm");
    let found = w["variants"].as_object().unwrap();
    assert_eq!(found.len(), variants(key).len(), "{key}: {found:?}");
    for variant in variants(key) {
        let v = &w["variants"][variant];
        let what = format!("{key}.{variant}");
        // Every way of reading read the same bytes.
        assert_eq!(number(v, "bytes"), bytes, "{what}");
        positive(v, "seconds");
        positive(v, "mb_per_s");
        // To the clock tick: a small workload may take less than one.
        assert!(number(v, "machine_cpu_seconds") >= 0.0, "{what}: {v}");
        let runs = v["runs"].as_array().unwrap();
        assert_eq!(runs.len(), number(json, "config.runs") as usize, "{what}");
        assert!(runs.iter().all(|r| number(r, "bytes") == bytes), "{what}");
        let requests = number(v, "device_read_requests");
        let sectors = number(v, "device_read_sectors");
        if cold {
            // Counted on the loop device, which only the bench uses.
            assert!(requests > 0.0 && sectors > 0.0, "{what}: {v}");
            assert!(!v["device_shared"].as_bool().unwrap(), "{what}");
        } else {
            assert_eq!(
                (requests, sectors),
                (0.0, 0.0),
                "{what}: warm reread hit the disk"
            );
        }
        if variant.ends_with("_mount") {
            positive(v, "daemon_peak_rss_kib");
            // A warm reread may never reach the daemon.
            if cold {
                positive(v, "daemon_cpu_seconds");
            }
        }
        if key == "random" {
            for stat in ["median", "mean", "p99"] {
                positive(v, &format!("latency_us.{stat}"));
            }
        }
    }
    let ratios = w["ratios"].as_object().unwrap();
    for anchor in ["plain_mount", "plain_direct"] {
        positive(&w["ratios"], &format!("time_verity_mount_vs_{anchor}"));
        if cold {
            positive(&w["ratios"], &format!("requests_verity_mount_vs_{anchor}"));
            positive(&w["ratios"], &format!("sectors_verity_mount_vs_{anchor}"));
        } else {
            assert!(w["ratios"][format!("requests_verity_mount_vs_{anchor}")].is_null());
        }
    }
    let per_run = w["ratios_per_run"].as_object().unwrap();
    assert_eq!(
        ratios.keys().collect::<Vec<_>>(),
        per_run.keys().collect::<Vec<_>>()
    );
}

#[test]
fn small_run_reports_every_workload() {
    require_root_and_fuse();
    let dir = scratch();
    let (stdout, json) = bench(
        dir.path(),
        &["--size=8M", "--files=100", "--reads=200", "--runs=1"],
    );
    for text in [
        "small files: 100 files of 16 KiB",
        "random reads: 200 reads of 4 KiB",
        "sequential read of a 8 MB file",
        "4 parallel readers, each reading its own 1 MB file",
        "16 parallel readers",
        "4 parallel readers of the same 8 MB file",
        "while 2 processes keep the CPUs busy",
        "page cache warm",
        "verity through the mount / plain read directly: time ",
        "verity through the mount / openssl dgst -sha256: time ",
        "ext4 on a loop device made for this run",
        "load average:",
    ] {
        assert!(stdout.contains(text), "no {text:?} in:\n{stdout}");
    }
    // Values and ratios only, no verdicts.
    for verdict in ["MISSED", " ok "] {
        assert!(!stdout.contains(verdict), "{verdict:?} in:\n{stdout}");
    }
    assert!(json.get("targets").is_none());

    assert_eq!(number(&json, "config.size_bytes"), (8 << 20) as f64);
    assert_eq!(json["config"]["loop_device"], Value::Bool(true));
    positive(&json, "machine.cpus");
    let device = json["machine"]["device"].as_str().unwrap();
    assert!(device.starts_with("loop"), "{device}");
    for i in 0..3 {
        assert!(json["machine"]["load_average_start"][i].is_number());
    }
    let workloads = json["workloads"].as_object().unwrap();
    assert_eq!(workloads.len(), WORKLOADS.len(), "{:?}", workloads.keys());
    for key in WORKLOADS {
        check_workload(&json, key);
    }

    let seq = &json["workloads"]["seq"];
    let library = &seq["variants"]["verity_library"];
    positive(library, "tree.tree_read_requests");
    positive(library, "tree.readahead_requests");
    // 8 MiB of 4 KiB blocks, each verified once.
    assert_eq!(number(library, "tree.data_blocks_verified"), 2048.0);
    for anchor in ["sha256sum", "openssl_dgst_sha256"] {
        positive(&seq["ratios"], &format!("time_verity_mount_vs_{anchor}"));
    }
    positive(&seq["ratios"], "time_verity_library_vs_plain_direct");
    for anchor in ["plain_mount", "plain_direct"] {
        positive(
            &json["workloads"]["random"]["ratios"],
            &format!("median_latency_verity_mount_vs_{anchor}"),
        );
    }
    assert!(json["huge"].is_null());

    let png = std::fs::read(dir.path().join("bench.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert!(width >= 800 && height >= 600, "{width}x{height}");
    assert!(
        png.len() > 20_000,
        "chart suspiciously small: {} bytes",
        png.len()
    );
}

#[test]
fn one_workload_on_the_disk_of_dir() {
    require_root_and_fuse();
    let dir = scratch();
    let (_, json) = bench(
        dir.path(),
        &[
            "--workload=random,warm",
            "--size=4M",
            "--reads=100",
            "--runs=2",
            "--dir-device",
        ],
    );
    assert_eq!(json["config"]["loop_device"], Value::Bool(false));
    let device = json["machine"]["device"].as_str().unwrap();
    assert!(!device.starts_with("loop"), "{device}");
    let workloads: Vec<&String> = json["workloads"].as_object().unwrap().keys().collect();
    assert_eq!(workloads, ["random", "warm"]);
    let random = &json["workloads"]["random"]["variants"]["verity_mount"];
    assert_eq!(random["runs"].as_array().unwrap().len(), 2);
    positive(random, "latency_us.median");
}

#[test]
fn ctrl_c_cleans_up() {
    require_root_and_fuse();
    let dir = scratch();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut child = Command::new(BIN)
        .arg("bench")
        .arg(format!("--dir={}", dir.path().display()))
        .args(["--size=64M", "--workload=seq", "--runs=20"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = Vec::new();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // Interrupted once the loop device is set up and a measurement runs.
    for line in lines.by_ref() {
        let line = line.unwrap();
        stderr.push(line.clone());
        if line.contains("run 1/20: seq") {
            // SAFETY: kill has no memory preconditions.
            assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
            break;
        }
    }
    stderr.extend(lines.map(Result::unwrap));
    let status = child.wait().unwrap();
    let stderr = stderr.join("\n");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(!dir.path().join("bench.json").exists());
    assert_cleaned_up(dir.path());
}

#[test]
fn usage_errors() {
    for args in [
        &["bench", "extra"][..],
        &["bench", "--runs=0"],
        &["bench", "--size=12x"],
        &["bench", "--files=0"],
        &["bench", "--workload=seq,bogus"],
        &["bench", "--bogus"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("verityfs bench"), "{args:?}: {stderr}");
    }
}
