//! A server process owned by a test: started on a free port of 127.0.0.1,
//! waited for until it accepts connections, killed and reaped on drop.

use std::fs::{self, File};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How long a server may take to listen: far above the measured startup
/// times, so only a broken server reaches it.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How much of a server's output an error message quotes.
const LOG_TAIL: usize = 8 * 1024;

/// How many free ports are tried: a port is found free by binding it and
/// released before the server binds it, so another process may take it in
/// between.
const PORT_ATTEMPTS: usize = 5;

/// A running server process; killed and reaped on drop.
pub(crate) struct Daemon {
    child: Child,
    name: &'static str,
    log: PathBuf,
}

impl Daemon {
    /// Starts `command` with its output going to `log`, and waits until it
    /// accepts connections on `addr`. An error carries the log; it is of
    /// kind `AddrInUse` if the server found its port taken.
    pub fn start(
        name: &'static str,
        mut command: Command,
        log: &Path,
        addr: SocketAddr,
    ) -> io::Result<Daemon> {
        let out = File::create(log)?;
        command
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let child = command
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run {name}: {e}")))?;
        let mut daemon = Daemon {
            child,
            name,
            log: log.to_owned(),
        };
        daemon.wait_ready(addr)?;
        Ok(daemon)
    }

    /// Waits until the server accepts a connection on `addr`.
    fn wait_ready(&mut self, addr: SocketAddr) -> io::Result<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                let log = self.log_text();
                let kind = if log.contains("Address already in use") {
                    io::ErrorKind::AddrInUse
                } else {
                    io::ErrorKind::Other
                };
                return Err(io::Error::new(
                    kind,
                    format!(
                        "{} exited ({status}) before listening on {addr}; its log:\n{log}",
                        self.name
                    ),
                ));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} did not listen on {addr} within {READY_TIMEOUT:?}; its log:\n{}",
                        self.name,
                        self.log_text()
                    ),
                ));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The end of the server's output so far (at most [`LOG_TAIL`]
    /// bytes: moto logs every request), or why it cannot be read.
    pub fn log_text(&self) -> String {
        match fs::read(&self.log) {
            Ok(log) => {
                let tail = &log[log.len().saturating_sub(LOG_TAIL)..];
                String::from_utf8_lossy(tail).into_owned()
            }
            Err(e) => format!("({} unreadable: {e})", self.log.display()),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Errors mean the process is already gone: nothing left to do.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `start` on a free port of 127.0.0.1, and again on another one
/// while it fails with `AddrInUse`.
pub(crate) fn on_free_port<T>(mut start: impl FnMut(SocketAddr) -> io::Result<T>) -> io::Result<T> {
    let mut attempt = 1;
    loop {
        let addr = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?;
        match start(addr) {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && attempt < PORT_ATTEMPTS => {
                attempt += 1;
            }
            result => return result,
        }
    }
}
