//! Command-line errors of `stats` and `verify` on the wrong kind of path,
//! and of `mount` given a URL with credentials:
//! each names the real problem and fails.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;

/// A fresh temporary directory (canonical path).
fn temp_dir() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().canonicalize().unwrap();
    (dir, path)
}

#[test]
fn stats_names_the_real_problem() {
    let (_dir, base) = temp_dir();
    let out = run(Command::new(VERITYFS)
        .arg("stats")
        .arg(base.join("nonexistent")));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("No such file or directory"), "{err}");
    assert!(!err.contains("No data available"), "{err}");
    // A directory that exists but is no verityfs mount.
    let out = run(Command::new(VERITYFS).arg("stats").arg(&base));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("is not a verityfs mount"), "{err}");
    assert!(!err.contains("No data available"), "{err}");
}

#[test]
fn verify_of_something_that_is_no_file_fails() {
    let (_dir, base) = temp_dir();
    let fifo = base.join("fifo");
    run_ok(Command::new("mkfifo").arg(&fifo));
    for path in [fifo.as_path(), Path::new("/dev/null")] {
        let out = run(Command::new(VERITYFS).arg("verify").arg(path));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{path:?}: {err}");
        assert!(
            err.contains(path.to_str().unwrap()) && err.contains("not a regular file"),
            "{err}"
        );
    }
    // Other files still count in the same run.
    fs::write(base.join("plain"), b"x").unwrap();
    let out = run(Command::new(VERITYFS)
        .arg("verify")
        .arg(base.join("plain"))
        .arg(&fifo));
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("1 not verity"), "{stdout}");
}

#[test]
fn a_url_with_credentials_is_refused_without_repeating_them() {
    let (_dir, base) = temp_dir();
    let digest = format!("--digest=sha256:{}", "0".repeat(64));
    for url in [
        "http://alice:s3cret@127.0.0.1:1/img",
        "HTTP:///alice:s3cret@127.0.0.1:1/img",
    ] {
        let out = run(Command::new(VERITYFS)
            .arg("mount")
            .arg(url)
            .arg(&base)
            .arg(&digest)
            .stdin(std::process::Stdio::null()));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{url}: {err}");
        assert!(err.contains("user name or password"), "{url}: {err}");
        assert!(!err.contains("alice") && !err.contains("s3cret"), "{err}");
    }
}
