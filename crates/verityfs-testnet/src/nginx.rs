//! A private nginx serving a directory as static files, with an access log
//! the tests read back to count and inspect the requests a client made.

use std::fs;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::daemon::{self, Daemon};
use crate::http;

/// Debian's nginx binary (package `nginx`).
const NGINX: &str = "/usr/sbin/nginx";

/// The path prefix of [`Nginx::requests`]' own requests; they are answered
/// without a file lookup and left out of the list.
const SYNC_PREFIX: &str = "/.verityfs-testnet-sync/";

/// How long [`Nginx::requests`] waits for its own request to be logged.
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);

/// One request as nginx logged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// nginx's serial number of the client connection: equal numbers mean
    /// the requests came on one kept-alive connection.
    pub connection: u64,
    /// The method, e.g. `GET`.
    pub method: String,
    /// The request target as sent, path and query.
    pub uri: String,
    /// The status code sent.
    pub status: u16,
    /// The `Range` header, if the request had one.
    pub range: Option<String>,
    /// How many body bytes were sent (fewer than the body's length if the
    /// client went away).
    pub body_bytes_sent: u64,
}

/// A private nginx on 127.0.0.1, serving a directory; killed and reaped on
/// drop.
///
/// It runs as one process (`master_process off`), in the foreground, with
/// its configuration, logs and temporary directories in a private prefix.
/// Having no workers, it never switches user: run by root, as the tests
/// are, it serves files only root may read.
/// Files are served with `sendfile`, byte ranges (single and multiple) are
/// nginx's own, and a connection may carry any number of requests. Each
/// request is written to the access log as it ends (no log buffer).
/// It is ready about 10 ms after it is started (the readiness check's
/// polling interval).
pub struct Nginx {
    // Declared first so it is killed before its prefix is removed.
    daemon: Daemon,
    addr: SocketAddr,
    access_log: PathBuf,
    syncs: AtomicU64,
    _prefix: TempDir,
}

impl Nginx {
    /// Starts nginx serving the files under `root` at [`Nginx::url`].
    ///
    /// Fails, with nginx's error log, if it does not start; and if
    /// `/usr/sbin/nginx` is missing, with how to install it.
    pub fn serve(root: &Path) -> io::Result<Nginx> {
        if !Path::new(NGINX).exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{NGINX} is missing: install Debian's nginx package (apt-get install nginx, or run scripts/test.sh as root)"),
            ));
        }
        let root = root
            .canonicalize()
            .map_err(|e| io::Error::new(e.kind(), format!("nginx root {}: {e}", root.display())))?;
        daemon::on_free_port(|addr| Nginx::start(&root, addr))
    }

    fn start(root: &Path, addr: SocketAddr) -> io::Result<Nginx> {
        let prefix = tempfile::Builder::new()
            .prefix("verityfs-nginx")
            .tempdir()?;
        let dir = prefix.path();
        // The configuration names the root through a link in the prefix, so
        // no character of the caller's path needs quoting for nginx.
        std::os::unix::fs::symlink(root, dir.join("root"))?;
        let config = config(dir, addr)?;
        fs::write(dir.join("nginx.conf"), config)?;
        let error_log = dir.join("error.log");
        let mut command = Command::new(NGINX);
        command
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .arg("-e")
            .arg(&error_log);
        let daemon = Daemon::start("nginx", command, &error_log, addr)?;
        Ok(Nginx {
            daemon,
            addr,
            access_log: dir.join("access.log"),
            syncs: AtomicU64::new(0),
            _prefix: prefix,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its base URL, `http://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Every request logged so far, oldest first.
    ///
    /// A request is logged just after its last byte is sent, so a client
    /// may see a response before its log line exists. To leave no such
    /// race to the tests, this first sends a request of its own and waits
    /// for its line: nginx handles its connections in one event loop, so
    /// every response a client had completely received by then is logged
    /// before it. Its own requests are left out.
    pub fn requests(&self) -> io::Result<Vec<Request>> {
        let serial = self.syncs.fetch_add(1, Ordering::Relaxed);
        let marker = format!("{SYNC_PREFIX}{serial}");
        http::get(&format!("http://{}{marker}", self.addr), None)?;
        let started = Instant::now();
        loop {
            let log = fs::read_to_string(&self.access_log)?;
            // Only whole lines: one may be being written.
            let requests = log
                .split_inclusive('\n')
                .filter_map(|line| line.strip_suffix('\n'))
                .map(parse_line)
                .collect::<io::Result<Vec<_>>>()?;
            if let Some(end) = requests.iter().position(|r| r.uri == marker) {
                let mut requests = requests;
                requests.truncate(end);
                requests.retain(|r| !r.uri.starts_with(SYNC_PREFIX));
                return Ok(requests);
            }
            if started.elapsed() > SYNC_TIMEOUT {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "nginx did not log {marker} within {SYNC_TIMEOUT:?}; its error log:\n{}",
                        self.daemon.log_text()
                    ),
                ));
            }
            thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The configuration of an nginx with prefix `dir`, listening on `addr`.
fn config(dir: &Path, addr: SocketAddr) -> io::Result<String> {
    let dir = dir
        .to_str()
        .filter(|d| !d.contains(['"', '\\', '$', '\n', '{', '}', ';']))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "temporary directory {} unusable in nginx's configuration",
                    dir.display()
                ),
            )
        })?;
    Ok(format!(
        r#"daemon off;
master_process off;
pid "{dir}/nginx.pid";
error_log "{dir}/error.log" notice;
events {{
    worker_connections 1024;
}}
http {{
    # Tab-separated; JSON escaping turns any tab or quote in a field
    # into an escape sequence, so the split is unambiguous.
    log_format verityfs escape=json '$connection\t$request_method\t$request_uri\t$status\t$http_range\t$body_bytes_sent';
    access_log "{dir}/access.log" verityfs;
    client_body_temp_path "{dir}/client_body";
    proxy_temp_path "{dir}/proxy";
    fastcgi_temp_path "{dir}/fastcgi";
    uwsgi_temp_path "{dir}/uwsgi";
    scgi_temp_path "{dir}/scgi";
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_requests 1000000;
    keepalive_timeout 600s;
    server {{
        listen {addr};
        root "{dir}/root";
        location ^~ {SYNC_PREFIX} {{
            return 204;
        }}
    }}
}}
"#
    ))
}

/// Parses one access log line (see the `log_format` of [`config`]).
fn parse_line(line: &str) -> io::Result<Request> {
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad access log line {line:?}"),
        )
    };
    let fields: Vec<&str> = line.split('\t').collect();
    let [connection, method, uri, status, range, sent] = fields[..] else {
        return Err(bad());
    };
    let range = unescape(range).ok_or_else(bad)?;
    Ok(Request {
        connection: connection.parse().map_err(|_| bad())?,
        method: unescape(method).ok_or_else(bad)?,
        uri: unescape(uri).ok_or_else(bad)?,
        status: status.parse().map_err(|_| bad())?,
        range: (!range.is_empty()).then_some(range),
        body_bytes_sent: sent.parse().map_err(|_| bad())?,
    })
}

/// Undoes nginx's JSON escaping of a log field.
fn unescape(field: &str) -> Option<String> {
    let mut out = String::with_capacity(field.len());
    let mut chars = field.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        out.push(match chars.next()? {
            '"' => '"',
            '\\' => '\\',
            '/' => '/',
            'b' => '\u{8}',
            'f' => '\u{c}',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'u' => {
                let hex: String = chars.by_ref().take(4).collect();
                char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?
            }
            _ => return None,
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_log_line_with_escapes() {
        let request = parse_line("7\tGET\t/a\\\"b\\u0009c?x=1\t206\tbytes=10-19\t10").unwrap();
        assert_eq!(
            request,
            Request {
                connection: 7,
                method: "GET".into(),
                uri: "/a\"b\tc?x=1".into(),
                status: 206,
                range: Some("bytes=10-19".into()),
                body_bytes_sent: 10,
            }
        );
        assert_eq!(parse_line("1\tGET\t/\t200\t\t0").unwrap().range, None);
        assert!(parse_line("1\tGET\t/\t200\t0").is_err());
        assert!(parse_line("1\tGET\t/\\x\t200\t\t0").is_err());
    }
}
