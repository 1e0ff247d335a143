//! CPU hogs for the busy-machine workload: shell processes spinning in an
//! empty loop, killed and reaped when dropped.

use std::process::{Child, Command, Stdio};

use super::{Context, Result};

/// Running hog processes.
pub struct Hogs(Vec<Child>);

impl Hogs {
    /// Starts `n` hogs.
    pub fn start(n: usize) -> Result<Hogs> {
        let mut hogs = Hogs(Vec::with_capacity(n));
        for _ in 0..n {
            let child = Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .ctx("can't start a CPU hog (sh)")?;
            hogs.0.push(child);
        }
        Ok(hogs)
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
