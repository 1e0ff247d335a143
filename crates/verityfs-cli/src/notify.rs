//! systemd's readiness protocol for `Type=notify` services (sd_notify(3)):
//! a `READY=1` datagram to the unix socket `NOTIFY_SOCKET` names (a path,
//! or an abstract name written `@name`), sent once the mount exists, so
//! that units ordered after the service find the filesystem mounted.

use std::ffi::OsStr;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::Path;
use std::time::Duration;

use verityfs::mountinfo;

/// How often the mount table is looked at while waiting for the mount.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// If systemd waits for readiness (`NOTIFY_SOCKET` is set), starts a thread
/// that sends `READY=1` as soon as a new mount appears on `mountpoint` (a
/// canonical path). Does nothing otherwise.
pub fn ready_when_mounted(mountpoint: &Path) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let target = mountpoint.to_owned();
    let before = mounts_on(&target);
    let spawned = std::thread::Builder::new()
        .name("sd-notify".into())
        .spawn(move || {
            while mounts_on(&target) <= before {
                std::thread::sleep(POLL_INTERVAL);
            }
            if let Err(e) = send(&socket, b"READY=1") {
                tracing::error!("cannot notify systemd on {}: {e}", socket.to_string_lossy());
            }
        });
    if let Err(e) = spawned {
        tracing::error!("cannot start the readiness notifier: {e}");
    }
}

/// Sends one notification datagram to `socket`.
pub fn send(socket: &OsStr, message: &[u8]) -> io::Result<()> {
    let sender = UnixDatagram::unbound()?;
    match socket.as_bytes().strip_prefix(b"@") {
        Some(name) => sender.send_to_addr(message, &SocketAddr::from_abstract_name(name)?),
        None => sender.send_to(message, socket),
    }
    .map(drop)
}

/// The number of mounts on `target`.
fn mounts_on(target: &Path) -> usize {
    let mounts = mountinfo::mounts().unwrap_or_default();
    mounts.iter().filter(|m| m.point == target).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_paths_and_abstract_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let receiver = UnixDatagram::bind(&path).unwrap();
        send(path.as_os_str(), b"READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        let name = format!("verityfs-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let receiver = UnixDatagram::bind_addr(&addr).unwrap();
        send(OsStr::new(&format!("@{name}")), b"READY=1").unwrap();
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
    }
}
