//! A `verityfs mount` child process, always unmounted and reaped: by
//! [`Mount::stop`], or on drop when a measurement fails.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use verityfs::mountinfo;

use super::{Context, Result};

/// How long the daemon may take to mount, and to exit once unmounted.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A mounted `verityfs mount BACKING POINT` child.
pub struct Mount {
    child: Option<Child>,
    point: PathBuf,
}

impl Mount {
    /// Runs this program's `mount` command on `backing` at `point` (made if
    /// needed) and waits until the mount appears in `/proc/self/mountinfo`.
    pub fn start(backing: &Path, point: &Path) -> Result<Mount> {
        std::fs::create_dir_all(point).ctx(format!("can't create '{}'", point.display()))?;
        let point = std::fs::canonicalize(point).ctx(format!("'{}'", point.display()))?;
        if is_mounted(&point) {
            return Err(format!(
                "'{}' is already a mount point (another bench running, or left over: umount it)",
                point.display()
            ));
        }
        // This very program, even if a rebuild has replaced its file since
        // it started; named as usual in `ps`.
        let mut command = Command::new("/proc/self/exe");
        if let Ok(exe) = std::env::current_exe() {
            command.arg0(exe);
        }
        command.arg("mount").arg(backing).arg(&point);
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .ctx("can't run verityfs mount")?;
        let mut mount = Mount {
            child: Some(child),
            point,
        };
        let deadline = Instant::now() + TIMEOUT;
        while !is_mounted(&mount.point) {
            let child = mount.child.as_mut().expect("child present until stopped");
            if let Some(status) = child.try_wait().ctx("waiting for verityfs mount")? {
                mount.child = None;
                return Err(format!(
                    "verityfs mount of '{}' exited ({status}) before mounting",
                    mount.point.display()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "verityfs mount did not mount '{}' within {} s",
                    mount.point.display(),
                    TIMEOUT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(mount)
    }

    /// The path of `name` inside the mount.
    pub fn path(&self, name: &str) -> PathBuf {
        self.point.join(name)
    }

    /// The daemon's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Unmounts with `umount` and waits for the daemon to exit.
    pub fn stop(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let mut result = Ok(());
        // The kernel may still hold the last file briefly after close:
        // retry a busy unmount a few times.
        for attempt in 0.. {
            if !is_mounted(&self.point) {
                break;
            }
            match umount(&self.point, false) {
                Ok(()) => break,
                Err(e) if attempt >= 20 => {
                    result = Err(e);
                    break;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() && result.is_ok() {
                        result = Err(format!(
                            "verityfs mount of '{}' exited with {status}",
                            self.point.display()
                        ));
                    }
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    if result.is_ok() {
                        result = Err(format!(
                            "verityfs mount of '{}' did not exit after unmounting: killed",
                            self.point.display()
                        ));
                    }
                    break;
                }
            }
        }
        // A killed daemon leaves a dead mount ("Transport endpoint is not
        // connected"): detach it.
        if is_mounted(&self.point) {
            let _ = umount(&self.point, true);
        }
        result
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            crate::output::error_msg(e);
        }
    }
}

/// Runs `umount [-l] POINT`.
pub fn umount(point: &Path, lazy: bool) -> Result<()> {
    let mut command = Command::new("umount");
    if lazy {
        command.arg("-l");
    }
    let output = command
        .arg(point)
        .stdin(Stdio::null())
        .output()
        .ctx("can't run umount")?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "umount '{}': {}",
            point.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Whether something is mounted on `point` (a canonical path), per
/// `/proc/self/mountinfo`.
pub fn is_mounted(point: &Path) -> bool {
    matches!(mountinfo::mount_on(point), Ok(Some(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_mounted() {
        assert!(is_mounted(Path::new("/")));
    }
}
