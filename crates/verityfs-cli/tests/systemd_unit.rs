//! `contrib/systemd/verityfs@.service`, started and stopped as systemd
//! would, without systemd: the test reads the unit's `ExecStart=`, expands
//! it as systemd does (`%i`, `%f`, `${VAR}` and `$VAR` from the
//! `EnvironmentFile=`), runs exactly that command line with a temporary
//! mount point as the instance, checks that the mount appears and works,
//! then sends SIGTERM as `systemctl stop` does and checks that the daemon
//! exits with status 0 and the mount is gone.
//!
//! Only `/usr/bin/verityfs` is replaced, by the binary under test. The
//! instance names are checked against systemd's own `systemd-escape`. Needs
//! root and `/dev/fuse`, like `tests/mount.rs`, and Debian's `systemd`
//! package; fails without them.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const VERITYFS: &str = env!("CARGO_BIN_EXE_verityfs");
/// Where the unit expects the program (the .deb installs it there).
const INSTALLED: &str = "/usr/bin/verityfs";
const TIMEOUT: Duration = Duration::from_secs(10);

fn unit_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd/verityfs@.service")
}

/// The settings of `section` in a unit file, in order (comments, blank
/// lines and other sections skipped; no line continuations are used).
fn section(unit: &str, section: &str) -> Vec<(String, String)> {
    let mut current = String::new();
    let mut out = Vec::new();
    for line in unit.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        assert!(!line.ends_with('\\'), "continuation lines are not handled");
        if line.starts_with('[') {
            current = line.trim_matches(['[', ']']).to_owned();
        } else if current == section {
            let (key, value) = line.split_once('=').expect("key=value");
            out.push((key.trim().to_owned(), value.trim().to_owned()));
        }
    }
    out
}

fn setting<'a>(settings: &'a [(String, String)], key: &str) -> &'a str {
    let mut found = settings.iter().filter(|(k, _)| k == key);
    let (_, value) = found.next().unwrap_or_else(|| panic!("no {key}="));
    assert!(found.next().is_none(), "several {key}=");
    value
}

/// `systemd-escape --path`: `/` between components becomes `-`, and
/// anything but ASCII letters, digits, `_` and a non-leading `.` becomes
/// `\xNN`.
fn escape_path(path: &Path) -> String {
    let text = path.to_str().unwrap().trim_matches('/');
    let mut out = String::new();
    for (i, b) in text.bytes().enumerate() {
        match b {
            b'/' => out.push('-'),
            b'.' if i > 0 => out.push('.'),
            b if b.is_ascii_alphanumeric() || b == b'_' => out.push(b as char),
            b => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out
}

/// `systemd-escape ARGS...`'s output line: systemd's own escaping, which
/// [`escape_path`] and [`unescape_path`] must match.
fn systemd_escape(args: &[&str]) -> String {
    let out = Command::new("systemd-escape")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run systemd-escape ({e}): install Debian's systemd package")
        });
    assert!(out.status.success(), "systemd-escape {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim_end().to_owned()
}

/// The inverse of [`escape_path`], with the leading `/` (systemd's `%f`).
fn unescape_path(instance: &str) -> String {
    let mut out = String::from("/");
    let mut rest = instance;
    while let Some(c) = rest.chars().next() {
        if let Some(hex) = rest.strip_prefix("\\x") {
            out.push(u8::from_str_radix(&hex[..2], 16).unwrap() as char);
            rest = &hex[2..];
        } else {
            out.push(if c == '-' { '/' } else { c });
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// Expands the specifiers the unit may use (`%i`, `%I`, `%f`, `%%`).
fn specifiers(text: &str, instance: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('i') => out.push_str(instance),
            Some('I') | Some('f') => out.push_str(&unescape_path(instance)),
            Some('%') => out.push('%'),
            other => panic!("specifier %{other:?} not handled by this test"),
        }
    }
    out
}

/// A systemd environment file: `KEY=value` lines, values optionally quoted.
fn environment_file(text: &str) -> HashMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.to_owned(), v.trim_matches('"').to_owned())
        })
        .collect()
}

/// Splits and expands an `ExecStart=` line as systemd does: the optional
/// prefixes (`-@:+!`) are dropped, `${VAR}` is one word, a word that is
/// exactly `$VAR` becomes the variable's whitespace-separated words (none
/// if unset or empty). Quotes are not used by the unit.
fn exec_argv(line: &str, env: &HashMap<String, String>) -> Vec<String> {
    let line = line.trim_start_matches(['-', '@', ':', '+', '!']);
    assert!(!line.contains(['"', '\'']), "quoting is not handled");
    let mut argv = Vec::new();
    for word in line.split_whitespace() {
        if let Some(name) = word.strip_prefix('$').filter(|n| !n.starts_with('{')) {
            let value = env.get(name).map(String::as_str).unwrap_or_default();
            argv.extend(value.split_whitespace().map(str::to_owned));
            continue;
        }
        let mut expanded = String::new();
        let mut rest = word;
        while let Some(start) = rest.find("${") {
            let end = rest[start..].find('}').expect("closing brace") + start;
            expanded.push_str(&rest[..start]);
            expanded.push_str(env.get(&rest[start + 2..end]).map_or("", String::as_str));
            rest = &rest[end + 1..];
        }
        expanded.push_str(rest);
        argv.push(expanded);
    }
    argv
}

fn is_mounted(path: &Path) -> bool {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let path = path.to_str().unwrap();
    mountinfo.lines().any(|l| l.split(' ').nth(4) == Some(path))
}

fn fstype(path: &Path) -> Option<String> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let path = path.to_str().unwrap();
    let line = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(path))?;
    let after = line.split(" - ").nth(1)?;
    after.split(' ').next().map(str::to_owned)
}

fn wait_exit(child: &mut Child) -> Option<ExitStatus> {
    let deadline = Instant::now() + TIMEOUT;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Kills and unmounts whatever is left if the test fails half-way.
struct Guard {
    child: Child,
    mnt: PathBuf,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

#[test]
fn unit_parses_as_expected() {
    let unit = fs::read_to_string(unit_path()).unwrap();
    let service = section(&unit, "Service");
    assert_eq!(setting(&service, "Type"), "simple");
    assert!(service.iter().all(|(k, _)| k != "ExecStop"));
    let exec = setting(&service, "ExecStart");
    assert!(exec.starts_with(&format!("{INSTALLED} mount ")), "{exec}");
    assert!(setting(&section(&unit, "Unit"), "Documentation").contains("man:verityfs-mount(1)"));

    // The helpers agree with systemd-escape.
    let path = "/srv/my-verity.d/a b";
    let escaped = "srv-my\\x2dverity.d-a\\x20b";
    assert_eq!(escape_path(Path::new(path)), escaped);
    assert_eq!(systemd_escape(&["--path", path]), escaped);
    assert_eq!(unescape_path(escaped), path);
    assert_eq!(systemd_escape(&["--unescape", "--path", escaped]), path);
    let env = environment_file("BACKING=/b\nOPTIONS=\"-o ro  --threads=2\"\n");
    assert_eq!(
        exec_argv("-/x ${BACKING} %f $OPTIONS $UNSET", &env),
        ["/x", "/b", "%f", "-o", "ro", "--threads=2"]
    );
}

#[test]
fn exec_start_mounts_and_sigterm_unmounts() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test must run as root (FUSE mounts)"
    );
    let unit = fs::read_to_string(unit_path()).unwrap();
    let service = section(&unit, "Service");

    let root = tempfile::tempdir().unwrap();
    let base = root.path().canonicalize().unwrap();
    let (backing, mnt) = (base.join("backing"), base.join("verity-mnt"));
    fs::create_dir(&backing).unwrap();
    fs::write(backing.join("hello"), b"hello, world\n").unwrap();
    // The mount point is missing: the daemon creates it.
    let instance = escape_path(&mnt);
    assert_eq!(instance, systemd_escape(&["--path", mnt.to_str().unwrap()]));

    // /etc/verityfs/%i.conf, written to the temporary directory.
    let env_setting = specifiers(setting(&service, "EnvironmentFile"), &instance);
    assert_eq!(env_setting, format!("/etc/verityfs/{instance}.conf"));
    let env_file = base.join(Path::new(&env_setting).file_name().unwrap());
    fs::write(
        &env_file,
        format!(
            "# as documented in the unit\nBACKING={}\nOPTIONS=-o allow_other --threads=2\n",
            backing.display()
        ),
    )
    .unwrap();
    let env = environment_file(&fs::read_to_string(&env_file).unwrap());

    let exec = specifiers(setting(&service, "ExecStart"), &instance);
    let mut argv = exec_argv(&exec, &env);
    assert_eq!(argv[0], INSTALLED);
    assert_eq!(
        argv[1..],
        [
            "mount",
            backing.to_str().unwrap(),
            mnt.to_str().unwrap(),
            "-o",
            "allow_other",
            "--threads=2"
        ]
    );
    argv[0] = VERITYFS.to_owned();

    // As systemd starts a Type=simple service: stdin from /dev/null.
    let log = base.join("journal");
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(fs::File::create(&log).unwrap())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut guard = Guard {
        child,
        mnt: mnt.clone(),
    };
    let deadline = Instant::now() + TIMEOUT;
    while !is_mounted(&mnt) {
        if let Some(status) = guard.child.try_wait().unwrap() {
            panic!(
                "{argv:?} exited ({status}): {}",
                fs::read_to_string(&log).unwrap()
            );
        }
        assert!(Instant::now() < deadline, "{argv:?} did not mount");
        thread::sleep(Duration::from_millis(10));
    }
    let fstype = fstype(&mnt).unwrap();
    assert!(fstype == "fuse" || fstype == "fuse.verityfs", "{fstype}");
    assert_eq!(fs::read(mnt.join("hello")).unwrap(), b"hello, world\n");

    // systemctl stop: SIGTERM to the main process.
    let pid = rustix::process::Pid::from_child(&guard.child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = wait_exit(&mut guard.child).expect("the daemon did not exit on SIGTERM");
    assert_eq!(
        status.code(),
        Some(0),
        "exit {status}: {}",
        fs::read_to_string(&log).unwrap()
    );
    assert!(!is_mounted(&mnt), "still mounted after SIGTERM");
    // Nothing logged on the happy path.
    assert_eq!(fs::read_to_string(&log).unwrap(), "");
}
