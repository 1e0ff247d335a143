//! `verityfs bench` end to end on a small file: every figure of the JSON
//! report is there and positive, and the chart is a PNG. Needs root (it
//! drops caches and mounts FUSE), `/dev/fuse` and a disk-backed target
//! directory; fails without them.

use std::os::unix::fs::FileTypeExt;
use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_verityfs");

/// Fails, saying what is missing, unless the bench can run here.
fn require_root_and_fuse() {
    let euid = rustix::process::geteuid().as_raw();
    assert_eq!(
        euid, 0,
        "verityfs bench needs root (it drops caches and mounts FUSE); running as uid {euid}"
    );
    let fuse = std::fs::metadata("/dev/fuse");
    assert!(
        fuse.as_ref().is_ok_and(|m| m.file_type().is_char_device()),
        "verityfs bench needs /dev/fuse (a character device): {fuse:?}"
    );
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

#[test]
fn small_run_reports_every_figure() {
    require_root_and_fuse();
    // Under target/, on the disk: /tmp may be a tmpfs, which has no device
    // counters and keeps its data across drop_caches.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = Command::new(BIN)
        .args(["bench", "--size=8M", "--runs=1"])
        .arg(format!("--dir={}", dir.path().display()))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    // Shown if an assertion below fails.
    println!("{stdout}");
    for text in [
        "cold sequential read",
        "random 4 KiB reads",
        "verified read (mount) / openssl dgst -sha256",
        "tree I/O overhead, readahead on (mount)",
        "load average:",
    ] {
        assert!(stdout.contains(text), "no {text:?} in:\n{stdout}");
    }

    let json: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("bench.json")).unwrap()).unwrap();
    println!("{json:#}");
    assert_eq!(number(&json, "config.size_bytes"), (8 << 20) as f64);
    assert_eq!(number(&json, "config.runs"), 1.0);
    positive(&json, "machine.cpus");
    assert!(json["machine"]["device"]
        .as_str()
        .is_some_and(|d| !d.is_empty()));
    for i in 0..3 {
        assert!(json["machine"]["load_average_start"][i].is_number());
    }

    let sequential = json["sequential"].as_object().unwrap();
    let cases = [
        "plain_cat",
        "sha256sum",
        "openssl_dgst_sha256",
        "mount_plain",
        "mount_verity_readahead_on",
        "mount_verity_readahead_off",
        "library_verity_readahead_on",
        "library_verity_readahead_off",
    ];
    assert_eq!(sequential.len(), cases.len(), "{sequential:?}");
    for case in cases {
        let c = &json["sequential"][case];
        for field in [
            "mb_per_s",
            "seconds",
            "device_read_requests",
            "device_read_bytes",
            "own_read_bytes",
        ] {
            positive(c, field);
        }
        assert_eq!(c["runs"].as_array().map(Vec::len), Some(1), "{case}");
        if case.starts_with("mount_") {
            positive(c, "daemon_peak_rss_kib");
        }
        if case.starts_with("library_") {
            positive(c, "tree.tree_read_requests");
            positive(c, "tree.tree_blocks_read");
            // 8 MiB of 4 KiB blocks, each verified once.
            assert_eq!(number(c, "tree.data_blocks_verified"), 2048.0, "{case}");
        }
    }
    positive(
        &json["sequential"]["library_verity_readahead_on"],
        "tree.readahead_requests",
    );
    assert_eq!(
        number(
            &json["sequential"]["library_verity_readahead_off"],
            "tree.readahead_requests"
        ),
        0.0
    );

    let random = &json["random_4k"];
    for field in [
        "verity_cold_us",
        "plain_cold_us",
        "verity_warm_us",
        "plain_warm_us",
        "verity_cold_device_read_requests",
        "plain_cold_device_read_requests",
    ] {
        positive(random, field);
    }

    let ratios = json["ratios"].as_object().unwrap();
    let percentages = [
        "tree_io_overhead_pct",
        "tree_io_overhead_pct_readahead_off",
        "library_tree_io_overhead_pct",
        "library_tree_io_overhead_pct_readahead_off",
    ];
    let speed_ratios = [
        "verified_vs_openssl",
        "verified_vs_sha256sum",
        "verified_vs_plain_cat",
        "verified_vs_mount_plain",
        "readahead_speedup",
        "library_verified_vs_openssl",
        "library_readahead_speedup",
        "random_cold_latency_ratio",
        "random_warm_latency_ratio",
    ];
    assert_eq!(ratios.len(), percentages.len() + speed_ratios.len());
    for key in speed_ratios {
        positive(&json["ratios"], key);
    }
    for key in percentages {
        // Overheads may be negative on a small file (request sizes differ).
        assert!(number(&json["ratios"], key).is_finite(), "{key}");
    }
    for (key, target) in json["targets"].as_object().unwrap() {
        assert!(ratios.contains_key(key), "{key}");
        assert!(target["met"].is_boolean() && target["target"].is_string());
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

    // The test files are removed; the mount point is left unmounted.
    assert!(!dir.path().join("backing/verity.bin").exists());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mnt = dir.path().join("mnt");
    assert!(
        !mountinfo.contains(&*mnt.to_string_lossy()),
        "left mounted: {}",
        mnt.display()
    );
}

#[test]
fn usage_errors() {
    for args in [
        &["bench", "extra"][..],
        &["bench", "--runs=0"],
        &["bench", "--size=12x"],
        &["bench", "--bogus"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("verityfs bench"), "{args:?}: {stderr}");
    }
}
