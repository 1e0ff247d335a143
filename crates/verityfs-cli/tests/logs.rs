//! The daemon's messages on a real mount: plain text (no colour codes)
//! when stderr is not a terminal, `<N>` priority prefixes when stderr is
//! the journal (`JOURNAL_STREAM` names it), syslog datagrams with
//! `VERITYFS_LOG=syslog:SOCKET`, and each corruption reported once per read
//! although the kernel retries the failed read.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use common::*;

/// Makes the verity file `name`, corrupts its second block in the backing
/// file and reads it through the mount, which fails with `EIO`.
fn corrupt_and_read(m: &Mount, name: &str) {
    verity_file(m, name, 100_000);
    flip_byte(&m.backing(name), 4096 + 7);
    let err = fs::read(m.path(name)).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
}

fn corruption_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("FILE CORRUPTED!"))
        .collect()
}

/// Restarts the daemon of `m` with `env`.
fn restart_with(m: &mut Mount, env: &[(&str, String)]) {
    m.unmount();
    m.env = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    m.start(&[]);
}

#[test]
fn plain_text_and_one_report_per_corruption() {
    let mut m = Mount::new();
    // Another stream than stderr is the journal: still plain text.
    restart_with(&mut m, &[("JOURNAL_STREAM", "1:1".into())]);
    corrupt_and_read(&m, "a");
    corrupt_and_read(&m, "b");
    let log = m.log();
    assert!(!log.contains('\x1b'), "colour codes in a file:\n{log}");
    let lines = corruption_lines(&log);
    assert_eq!(lines.len(), 2, "one report per corrupted file:\n{log}");
    for (line, name) in lines.iter().zip(["a", "b"]) {
        let want = format!(
            "{}: FILE CORRUPTED! pos=4096, level=-1",
            m.backing(name).display()
        );
        assert!(line.contains(" WARN ") && line.contains(&want), "{line}");
    }
}

#[test]
fn journal_priorities_when_stderr_is_the_journal() {
    let mut m = Mount::new();
    let st = fs::metadata(&m.log).unwrap();
    // Mount::start truncates the log file in place: same device and inode.
    let stream = format!("{}:{}", st.dev(), st.ino());
    restart_with(
        &mut m,
        &[("JOURNAL_STREAM", stream), ("RUST_LOG", "info".into())],
    );
    corrupt_and_read(&m, "f");
    let log = m.log();
    let serving = format!("<6>serving {} on {}", m.backing.display(), m.mnt.display());
    assert!(log.lines().any(|l| l == serving), "{log}");
    let lines = corruption_lines(&log);
    assert_eq!(lines.len(), 1, "{log}");
    let want = format!(
        "<4>{}: FILE CORRUPTED! pos=4096, level=-1, ",
        m.backing("f").display()
    );
    assert!(lines[0].starts_with(&want), "{log}");
    assert!(log.lines().all(|l| l.starts_with('<')), "{log}");
}

#[test]
fn syslog_datagrams_on_request() {
    let mut m = Mount::new();
    let socket_path = m.scratch("log.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let env = [
        ("VERITYFS_LOG", format!("syslog:{}", socket_path.display())),
        ("RUST_LOG", "info".into()),
    ];
    restart_with(&mut m, &env);
    corrupt_and_read(&m, "f");

    let mut messages = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        if let Ok(n) = socket.recv(&mut buf) {
            messages.push(String::from_utf8(buf[..n].to_vec()).unwrap());
        }
    }
    let pid = m.daemon_pid().as_raw_nonzero();
    // Facility daemon (3): info is <30>, warning <28>.
    let serving = format!("<30>verityfs[{pid}]: serving {}", m.backing.display());
    assert!(
        messages.iter().any(|d| d.starts_with(&serving)),
        "{messages:?}"
    );
    let corrupted: Vec<_> = messages
        .iter()
        .filter(|d| d.contains("FILE CORRUPTED!"))
        .collect();
    assert_eq!(corrupted.len(), 1, "{messages:?}");
    let want = format!(
        "<28>verityfs[{pid}]: {}: FILE CORRUPTED! pos=4096",
        m.backing("f").display()
    );
    assert!(corrupted[0].starts_with(&want), "{corrupted:?}");
    assert_eq!(m.log(), "", "nothing on stderr");
}

#[test]
fn errors_carry_the_error_priority_in_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let (stderr_path, not_a_dir) = (dir.path().join("stderr"), dir.path().join("file"));
    fs::write(&not_a_dir, b"x").unwrap();
    let stderr = fs::File::create(&stderr_path).unwrap();
    let st = stderr.metadata().unwrap();
    let status = std::process::Command::new(VERITYFS)
        .arg("mount")
        .arg(&not_a_dir)
        .arg(dir.path().join("mnt"))
        .env("JOURNAL_STREAM", format!("{}:{}", st.dev(), st.ino()))
        .stderr(stderr)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(1));
    let said = fs::read_to_string(&stderr_path).unwrap();
    let want = format!(
        "<3>ERROR: backing directory '{}': Not a directory\n",
        not_a_dir.display()
    );
    assert_eq!(said, want);
}
