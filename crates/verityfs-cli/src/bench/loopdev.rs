//! The scratch area of a run: a fresh directory under `--dir` and, by
//! default, an ext4 filesystem in a sparse image file there, attached to a
//! loop device and mounted on a directory of its own. Only this benchmark
//! uses that loop device, so its request counters are ours alone, whatever
//! else the machine's disk is doing. Everything is removed when the run
//! ends, however it ends.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::measure::run_tool;
use super::mount::{is_mounted, umount};
use super::{note, Context, Result};

/// The run's own directory under `--dir`, removed with all it holds when
/// dropped (unless something is still mounted inside, which is then said).
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Makes `DIR/verityfs-bench-PID`.
    pub fn create(dir: &Path) -> Result<ScratchDir> {
        std::fs::create_dir_all(dir).ctx(format!("can't create '{}'", dir.display()))?;
        let dir = std::fs::canonicalize(dir).ctx(format!("'{}'", dir.display()))?;
        let path = dir.join(format!("verityfs-bench-{}", std::process::id()));
        std::fs::create_dir(&path).ctx(format!("can't create '{}'", path.display()))?;
        Ok(ScratchDir(path))
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if mounted_under(&self.0) {
            crate::output::error_msg(format!(
                "left '{}' in place: something is still mounted inside",
                self.0.display()
            ));
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            crate::output::error_msg(format!("can't remove '{}': {e}", self.0.display()));
        }
    }
}

/// Whether a mount point lies inside `dir`.
fn mounted_under(dir: &Path) -> bool {
    let mounts = verityfs::mountinfo::mounts().unwrap_or_default();
    mounts.iter().any(|m| m.point.starts_with(dir))
}

/// An ext4 filesystem on a loop device, mounted; detached and deleted on
/// drop.
pub struct LoopDisk {
    image: PathBuf,
    point: PathBuf,
    device: Option<String>,
}

impl LoopDisk {
    /// Makes a sparse `bytes`-byte image in `scratch`, formats it, attaches
    /// it to a free loop device (direct I/O, so the host's page cache does
    /// not serve its reads) and mounts it on `scratch/fs`.
    pub fn create(scratch: &Path, bytes: u64) -> Result<LoopDisk> {
        for (tool, package) in [("losetup", "util-linux"), ("mkfs.ext4", "e2fsprogs")] {
            if !super::measure::have_tool(tool) {
                return Err(format!(
                    "{tool} not found (install {package}, or use --dir-device)"
                ));
            }
        }
        let mut disk = LoopDisk {
            image: scratch.join("disk.img"),
            point: scratch.join("fs"),
            device: None,
        };
        let image = std::fs::File::create(&disk.image)
            .ctx(format!("can't create '{}'", disk.image.display()))?;
        image
            .set_len(bytes)
            .ctx(format!("can't extend '{}'", disk.image.display()))?;
        drop(image);
        // Inode tables and journal written now, not by a background thread
        // during the measurements.
        let lazy_off = "lazy_itable_init=0,lazy_journal_init=0";
        run(
            "mkfs.ext4",
            &["-q", "-F", "-m", "0", "-E", lazy_off],
            &disk.image,
        )?;
        let device = attach(&disk.image)?;
        disk.device = Some(device.clone());
        std::fs::create_dir(&disk.point).ctx(format!("can't create '{}'", disk.point.display()))?;
        let options = ["-t", "ext4", "-o", "noatime", &device];
        run("mount", &options, &disk.point)?;
        note(format!(
            "made a {} MB ext4 filesystem on {device}, mounted on {}",
            bytes / 1_000_000,
            disk.point.display()
        ));
        Ok(disk)
    }

    /// Where the filesystem is mounted.
    pub fn root(&self) -> &Path {
        &self.point
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        let Some(device) = self.device.take() else {
            let _ = std::fs::remove_file(&self.image);
            return;
        };
        if let Err(e) = unmount(&self.point) {
            crate::output::error_msg(e);
        }
        if let Err(e) = run("losetup", &["-d"], Path::new(&device)) {
            crate::output::error_msg(e);
        }
        let _ = std::fs::remove_dir(&self.point);
        let _ = std::fs::remove_file(&self.image);
    }
}

/// `losetup --find --show --direct-io=on IMAGE`; the device it attached.
fn attach(image: &Path) -> Result<String> {
    let output = Command::new("losetup")
        .args(["--find", "--show", "--direct-io=on"])
        .arg(image)
        .stdin(Stdio::null())
        .output()
        .ctx("can't run losetup")?;
    let device = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if output.status.success() && device.starts_with("/dev/") {
        Ok(device)
    } else {
        Err(format!(
            "losetup of '{}' failed: {}",
            image.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Unmounts `point`, retrying while it is busy (the kernel may still hold
/// a file closed a moment ago), lazily as a last resort.
fn unmount(point: &Path) -> Result<()> {
    for _ in 0..20 {
        if !is_mounted(point) || umount(point, false).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    umount(point, true)
}

/// Runs `program args... path`; fails with its error output unless it
/// exits 0.
fn run(program: &str, args: &[&str], path: &Path) -> Result<()> {
    let mut all: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    all.push(path.as_os_str());
    run_tool(program, &all)
}
