//! Inside the VM: checks what the previous cut left on the disk, then runs
//! the next cut's workload through a verityfs mount until the host pulls
//! the plug.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fastrand::Rng;

use crate::common::{raw_measure, run_ok, Mount, FSVERITY};
use crate::plan::{log_stream, Acks, Plan, VerityFile, ACKS, CHECK_ACKS, CHECK_PLAN, PLAN, REPORT};

/// The disk under test (the oracle's first extra drive).
const DISK: &str = "/dev/vdb";
/// Where it is mounted.
const EXT4: &str = "/tmp/power-cut/ext4";
/// How long the daemon may take to mount: its binary is read over 9p by an
/// emulated CPU, on a machine that may be busy.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(180);

/// The guest's whole run: `io` is the directory shared with the host,
/// `program` the `verityfs` binary.
pub fn run(io: &Path, program: &Path) {
    let ext4 = Path::new(EXT4);
    fs::create_dir_all(ext4).unwrap();
    let check_plan = io.join(CHECK_PLAN);
    if check_plan.exists() {
        // The kernel replays the journal at this mount, as after any power
        // loss; the filesystem must then be clean.
        run_ok(Command::new("mount").args(["-t", "ext4", DISK, EXT4]));
        run_ok(Command::new("umount").arg(EXT4));
        run_ok(Command::new("e2fsck").args(["-f", "-n", DISK]));
    }
    run_ok(Command::new("mount").args(["-t", "ext4", DISK, EXT4]));
    let files = ext4.join("files");
    if check_plan.exists() {
        let acks = Acks::decode(&fs::read_to_string(io.join(CHECK_ACKS)).unwrap_or_default());
        let report = check(&Plan::read(&check_plan), &acks, &files, program);
        fs::write(io.join(REPORT), &report).unwrap();
        if report.contains("FAIL") {
            // Keep the evidence on the disk image; the host reports it.
            run_ok(Command::new("umount").arg(EXT4));
            return;
        }
        fs::remove_dir_all(&files).unwrap();
    }
    fs::create_dir_all(&files).unwrap();
    run_ok(&mut Command::new("sync"));
    if io.join(PLAN).exists() {
        workload(&Plan::read(&io.join(PLAN)), io, &files, program);
    }
    run_ok(Command::new("umount").arg(EXT4));
}

// ---------------------------------------------------------------------------
// After the cut
// ---------------------------------------------------------------------------

/// One report line per file: `verity NAME`, `intact NAME`, `partial NAME
/// LEN`, `absent NAME`, `log NAME LEN`, `log-zero-tail NAME LEN ZEROS`, or
/// `FAIL NAME WHY`.
fn check(plan: &Plan, acks: &Acks, files: &Path, program: &Path) -> String {
    let mut mount = Mount::over(files, program, MOUNT_TIMEOUT, &[]);
    let mut report = String::new();
    for file in &plan.files {
        report += &check_file(&mount, file, acks).unwrap_or_else(|why| fail(&file.name, &why));
        report.push('\n');
    }
    if let Some((name, seed)) = &plan.log {
        report += &check_log(&mount.path(name), *seed, acks.log_len)
            .unwrap_or_else(|why| fail(name, &why));
        report.push('\n');
    }
    mount.unmount();
    report
}

fn fail(name: &str, why: &str) -> String {
    format!("FAIL {name} {}", why.replace('\n', " "))
}

/// Either fully verity with the expected digest and every byte readable
/// and verified, or not verity with the original data (a prefix of it if
/// its fsync was never acknowledged) and nothing left of the enable in the
/// backing file.
fn check_file(mount: &Mount, file: &VerityFile, acks: &Acks) -> Result<String, String> {
    let path = mount.path(&file.name);
    let synced = acks.synced.contains(&file.name);
    let enabled = acks.enabled.contains(&file.name);
    match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == ErrorKind::NotFound && !synced => {
            return Ok(format!("absent {}", file.name))
        }
        Err(e) => return Err(format!("stat: {e}")),
        Ok(_) => {}
    }
    let data = file.data();
    match raw_measure(&path, 64) {
        Ok(digest) if digest == file.digest => {
            let content = fs::read(&path).map_err(|e| format!("reading the verity file: {e}"))?;
            if content != data {
                return Err("verity, but its contents differ from the original".into());
            }
            Ok(format!("verity {}", file.name))
        }
        Ok(digest) => Err(format!(
            "verity with digest {digest}, expected {}",
            file.digest
        )),
        Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {
            if enabled {
                return Err("enable acknowledged, but the file is not verity".into());
            }
            check_plain(mount, file, &data, synced)
        }
        Err(e) => Err(format!("measure: {e}")),
    }
}

fn check_plain(
    mount: &Mount,
    file: &VerityFile,
    data: &[u8],
    synced: bool,
) -> Result<String, String> {
    let content = fs::read(mount.path(&file.name)).map_err(|e| format!("reading: {e}"))?;
    if synced && content.len() != data.len() {
        return Err(format!(
            "{} bytes, {} written and fsynced",
            content.len(),
            data.len()
        ));
    }
    if !data.starts_with(&content) {
        return Err("contents differ from the original".into());
    }
    // The lookup above undid the interrupted enable: only the data is left.
    let backing = mount.backing(&file.name);
    let state = verityfs::FileState::read(&File::open(&backing).map_err(|e| e.to_string())?)
        .map_err(|e| format!("backing file state: {e}"))?;
    let backing_len = fs::metadata(&backing).map_err(|e| e.to_string())?.len();
    if state != verityfs::FileState::Regular || backing_len != content.len() as u64 {
        return Err(format!(
            "backing file left as {state:?}, {backing_len} bytes"
        ));
    }
    Ok(if content.len() == data.len() {
        format!("intact {}", file.name)
    } else {
        format!("partial {} {}", file.name, content.len())
    })
}

/// The log holds its stream up to at least the last acknowledged fsync.
/// Past that, ext4 may show zeros: an append within an already allocated
/// block moves the on-disk size before the data is written back, and a
/// journal commit for another file makes that size durable. Anything else
/// (other bytes, a shorter file) fails.
fn check_log(path: &Path, seed: u64, acked: usize) -> Result<String, String> {
    let content = match fs::read(path) {
        Err(e) if e.kind() == ErrorKind::NotFound && acked == 0 => Vec::new(),
        other => other.map_err(|e| format!("reading the log: {e}"))?,
    };
    let name = path.file_name().unwrap().to_string_lossy();
    if content.len() < acked {
        return Err(format!(
            "{} bytes, {acked} acknowledged by fsync",
            content.len()
        ));
    }
    let stream = log_stream(seed);
    let Some(diff) = content.iter().zip(&stream).position(|(a, b)| a != b) else {
        return Ok(format!("log {name} {}", content.len()));
    };
    let zeros = content[diff..].iter().all(|&b| b == 0);
    if diff < acked || !zeros {
        return Err(format!(
            "the log differs from what was written at byte {diff} of {} \
             ({acked} acknowledged; all zeros from there: {zeros})",
            content.len()
        ));
    }
    Ok(format!(
        "log-zero-tail {name} {} {}",
        content.len(),
        content.len() - diff
    ))
}

// ---------------------------------------------------------------------------
// Until the cut
// ---------------------------------------------------------------------------

/// Appends acknowledgements to the shared directory: each write is on the
/// host before it returns, so the host knows everything acknowledged
/// before the cut.
struct Acker {
    file: Mutex<File>,
    start: Instant,
}

impl Acker {
    fn ack(&self, what: &str) {
        let line = format!("{:.3} {what}\n", self.start.elapsed().as_secs_f64());
        self.file
            .lock()
            .unwrap()
            .write_all(line.as_bytes())
            .unwrap();
    }
}

/// Writes, fsyncs and enables each file of the plan in turn (the log
/// appended meanwhile), acknowledging each step once it returned, then
/// waits for the cut.
fn workload(plan: &Plan, io: &Path, files: &Path, program: &Path) -> ! {
    let mount = Mount::over(files, program, MOUNT_TIMEOUT, &[]);
    let acker = Arc::new(Acker {
        file: Mutex::new(
            OpenOptions::new()
                .create(true)
                .append(true)
                .custom_flags(libc::O_SYNC)
                .open(io.join(ACKS))
                .unwrap(),
        ),
        start: Instant::now(),
    });
    // The host starts its countdown to the cut when this step comes.
    let mut step = 0;
    let mut next_step = || {
        if step == plan.cut_step {
            fs::write(io.join("cut"), "").unwrap();
        }
        step += 1;
    };
    let mut rng = Rng::with_seed(plan.files[0].seed ^ 0x9a05e);
    if let Some((name, seed)) = plan.log.clone() {
        let (path, acker, pause) = (mount.path(&name), acker.clone(), plan.max_pause_ms / 4);
        thread::spawn(move || append_log(&path, &name, seed, pause, &acker));
    }
    for file in &plan.files {
        let data = file.data();
        pause(&mut rng, plan.max_pause_ms);
        next_step();
        write_synced(&mount.path(&file.name), &data);
        acker.ack(&format!("synced {}", file.name));
        pause(&mut rng, plan.max_pause_ms);
        next_step();
        enable(&mount.path(&file.name), &file.params());
        acker.ack(&format!("enabled {}", file.name));
    }
    acker.ack("done");
    next_step();
    loop {
        thread::park();
    }
}

fn pause(rng: &mut Rng, max_ms: u64) {
    thread::sleep(Duration::from_millis(rng.u64(..=max_ms)));
}

fn write_synced(path: &Path, data: &[u8]) {
    let mut file = File::create(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    file.write_all(data).unwrap();
    file.sync_all().unwrap();
}

/// `fsverity enable`, as a user runs it (not bounded: the host's timeout
/// is, and a big file takes long under emulation).
fn enable(path: &PathBuf, params: &[String]) {
    let out = Command::new(FSVERITY)
        .arg("enable")
        .arg(path)
        .args(params)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "fsverity enable {path:?} {params:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Appends chunks of the log's stream, each fsynced and acknowledged.
fn append_log(path: &Path, name: &str, seed: u64, max_pause_ms: u64, acker: &Acker) {
    let stream = log_stream(seed);
    let mut rng = Rng::with_seed(seed);
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    let mut len = 0;
    while len < stream.len() {
        let n = (1 + rng.usize(..64 << 10)).min(stream.len() - len);
        file.write_all(&stream[len..len + n]).unwrap();
        file.sync_all().unwrap();
        len += n;
        acker.ack(&format!("appended {name} {len}"));
        pause(&mut rng, max_pause_ms);
    }
}
