//! `contrib/systemd/verityfs@.service`, started and stopped as systemd
//! would, without systemd as PID 1: the test reads the unit's
//! `ExecStart=`, expands it as systemd does (`%i`, `%f`, `${VAR}` and
//! `$VAR` from the `EnvironmentFile=`), runs exactly that command line with
//! a temporary mount point as the instance, with the unit's capability
//! bounding set and no new privileges (`setpriv`), in a network namespace of
//! its own (`PrivateNetwork=`, `unshare --net`) and with `NOTIFY_SOCKET`
//! naming a socket of the test (`Type=notify`); checks that `READY=1`
//! arrives once the mount is there and that the mount works for ordinary
//! operations, then sends SIGTERM as `systemctl stop` does and checks that
//! the daemon exits with status 0 and the mount is gone. `systemd-analyze
//! verify` must accept the unit and `systemd-analyze security` rate it
//! below 5.
//!
//! Only `/usr/bin/verityfs` is replaced, by the binary under test. The
//! instance names are checked against systemd's own `systemd-escape`. Needs
//! root, `/dev/fuse`, Debian's `systemd` package (`systemd-escape`,
//! `systemd-analyze`), `setpriv`, `unshare` and `fsverity`; fails without
//! them.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixDatagram;
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

/// `unshare --net setpriv --bounding-set=... --no-new-privs --`: the
/// unit's `PrivateNetwork=`, `CapabilityBoundingSet=` and
/// `NoNewPrivileges=`, for the command appended to it.
fn sandboxed(service: &[(String, String)]) -> Command {
    assert_eq!(setting(service, "PrivateNetwork"), "yes");
    assert_eq!(setting(service, "PrivateMounts"), "no");
    assert_eq!(setting(service, "NoNewPrivileges"), "yes");
    let caps: Vec<String> = setting(service, "CapabilityBoundingSet")
        .split_whitespace()
        .map(|cap| format!("+{}", cap.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    let mut cmd = Command::new("unshare");
    cmd.args(["--net", "--", "setpriv"])
        .arg(format!("--bounding-set=-all,{}", caps.join(",")))
        .args(["--no-new-privs", "--"]);
    cmd
}

/// What users do on the mount, each needing one of the capabilities the
/// unit keeps: read, create, `fsverity enable` and read back, chown to
/// another user, a FIFO.
fn exercise(backing: &Path, mnt: &Path) {
    assert_eq!(fs::read(mnt.join("hello")).unwrap(), b"hello, world\n");
    let data = vec![42u8; 100_000];
    fs::write(mnt.join("f"), &data).unwrap();
    let out = Command::new("fsverity")
        .arg("enable")
        .arg(mnt.join("f"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fs::read(mnt.join("f")).unwrap(), data);
    std::os::unix::fs::chown(mnt.join("f"), Some(65534), Some(65534)).unwrap();
    assert_eq!(fs::metadata(backing.join("f")).unwrap().uid(), 65534);
    let fifo = Command::new("mkfifo")
        .arg(mnt.join("fifo"))
        .status()
        .unwrap();
    assert!(fifo.success());
    assert!(fs::metadata(backing.join("fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
}

/// The unit as installed for instance `srv-verity`, with `ExecStart=`
/// pointing at the binary under test (`systemd-analyze verify` checks that
/// it exists), in `dir`.
fn installed_instance(dir: &Path) -> PathBuf {
    let unit = fs::read_to_string(unit_path()).unwrap();
    let path = dir.join("verityfs@srv-verity.service");
    fs::write(&path, unit.replace(INSTALLED, VERITYFS)).unwrap();
    path
}

/// Runs `systemd-analyze ARGS` (which must be installed).
fn systemd_analyze(args: &[&str], unit: &Path) -> std::process::Output {
    Command::new("systemd-analyze")
        .args(args)
        .arg(unit)
        .current_dir(unit.parent().unwrap())
        .output()
        .unwrap_or_else(|e| panic!("systemd-analyze (package systemd) is needed: {e}"))
}

#[test]
fn systemd_analyze_accepts_the_unit_and_rates_it_below_5() {
    let dir = tempfile::tempdir().unwrap();
    let unit = installed_instance(dir.path());
    let out = systemd_analyze(&["verify", "--man=no"], &unit);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.is_empty(), "{said}");

    let out = systemd_analyze(&["security", "--offline=true", "--no-pager"], &unit);
    let report = String::from_utf8_lossy(&out.stdout);
    let level = report
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for verityfs@srv-verity.service: ")
                .nth(1)
        })
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no exposure level in:\n{report}"));
    assert!(level < 5.0, "exposure {level}:\n{report}");
}

#[test]
fn unit_parses_as_expected() {
    let unit = fs::read_to_string(unit_path()).unwrap();
    let service = section(&unit, "Service");
    assert_eq!(setting(&service, "Type"), "notify");
    assert_eq!(setting(&service, "NotifyAccess"), "main");
    // A missing configuration file fails the start instead of skipping it.
    let unit_section = section(&unit, "Unit");
    assert_eq!(
        setting(&unit_section, "AssertPathExists"),
        setting(&service, "EnvironmentFile")
    );
    assert!(unit_section
        .iter()
        .all(|(k, _)| !k.starts_with("Condition")));
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

    // As systemd starts the service: stdin from /dev/null, the unit's
    // sandbox as far as it can be had without systemd, and a socket for
    // the readiness notification.
    let notify_path = base.join("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(TIMEOUT)).unwrap();
    let log = base.join("journal");
    let child = sandboxed(&service)
        .args(&argv)
        .env("NOTIFY_SOCKET", &notify_path)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&log).unwrap())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut guard = Guard {
        child,
        mnt: mnt.clone(),
    };
    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf).unwrap_or_else(|e| {
        panic!(
            "no readiness notification ({e}); the daemon said: {}",
            fs::read_to_string(&log).unwrap()
        )
    });
    // Ready means mounted: units ordered after the service may use it.
    assert!(is_mounted(&mnt), "READY=1 before the mount");
    assert_eq!(&buf[..n], b"READY=1");
    let fstype = fstype(&mnt).unwrap();
    assert!(fstype == "fuse" || fstype == "fuse.verityfs", "{fstype}");
    exercise(&backing, &mnt);

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

#[test]
fn a_configuration_without_backing_fails_loudly() {
    let unit = fs::read_to_string(unit_path()).unwrap();
    let service = section(&unit, "Service");
    let env = environment_file("OPTIONS=-o ro\n");
    let exec = specifiers(setting(&service, "ExecStart"), "srv-verity");
    let mut argv = exec_argv(&exec, &env);
    assert_eq!(argv[2], "", "${{BACKING}} expands to an empty word");
    argv[0] = VERITYFS.to_owned();
    let existed = Path::new("/srv/verity").exists();
    let out = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("ERROR: the backing directory is an empty string (is BACKING set?)\n"),
        "{stderr}"
    );
    assert_eq!(
        Path::new("/srv/verity").exists(),
        existed,
        "nothing created"
    );
}
