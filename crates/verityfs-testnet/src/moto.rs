//! An S3-compatible server for the tests: moto's standalone server, run
//! from a Python venv that `scripts/test.sh` creates.

use std::env;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

use tempfile::TempDir;

use crate::daemon::{self, Daemon};
use crate::http;

/// Where the moto venv is unless `VERITYFS_MOTO_VENV` says otherwise.
pub const DEFAULT_VENV: &str = "/var/lib/verityfs-tests/moto";

/// The moto release the venv holds.
pub const MOTO_REQUIREMENT: &str = "moto[server]==5.2.5";

/// The access key id of the test credentials.
pub const ACCESS_KEY_ID: &str = "test";

/// The secret access key of the test credentials.
pub const SECRET_ACCESS_KEY: &str = "test";

/// The region of the test buckets.
pub const REGION: &str = "us-east-1";

/// moto's S3 server on 127.0.0.1, with an empty store; killed and reaped
/// on drop.
///
/// It takes about 0.2 s to start (moto's Python imports; measured 0.21 to
/// 0.22 s with Debian 12's Python 3.11, up to 0.7 s with two starting on a
/// busy 2-core machine), so a test file may share one among its checks,
/// each with its own bucket.
///
/// moto does not check signatures: any credentials work, and
/// [`ACCESS_KEY_ID`], [`SECRET_ACCESS_KEY`] and [`REGION`] are the
/// conventional ones (see [`Moto::env`]). Unsigned requests are anonymous
/// ones, though: they may create buckets and write objects, but reading a
/// (private) object needs an `Authorization` header, signed or not. Its
/// responses carry `Connection: close`: every request takes a new
/// connection.
pub struct Moto {
    // Declared first so it is killed before its log is removed.
    daemon: Daemon,
    addr: SocketAddr,
    _dir: TempDir,
}

impl Moto {
    /// Starts moto's server on a free port and waits until it listens.
    ///
    /// Fails, saying how to create it, if the venv ([`Moto::venv`]) is
    /// missing; and with moto's output if it does not start.
    pub fn start() -> io::Result<Moto> {
        let venv = Moto::venv();
        let server = venv.join("bin/moto_server");
        if !server.exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} is missing: run scripts/test.sh as root, which creates moto's venv, or create it with: \
                     /usr/bin/python3 -m venv {venv} && {venv}/bin/pip install -q '{MOTO_REQUIREMENT}' \
                     (the venv's place is VERITYFS_MOTO_VENV, by default {DEFAULT_VENV})",
                    server.display(),
                    venv = venv.display(),
                ),
            ));
        }
        daemon::on_free_port(|addr| {
            let dir = tempfile::Builder::new().prefix("verityfs-moto").tempdir()?;
            let mut command = Command::new(&server);
            command
                .arg("-H")
                .arg(addr.ip().to_string())
                .arg("-p")
                .arg(addr.port().to_string());
            let daemon = Daemon::start("moto_server", command, &dir.path().join("moto.log"), addr)?;
            Ok(Moto {
                daemon,
                addr,
                _dir: dir,
            })
        })
    }

    /// The moto venv: `VERITYFS_MOTO_VENV` if set, else [`DEFAULT_VENV`].
    pub fn venv() -> PathBuf {
        env::var_os("VERITYFS_MOTO_VENV").map_or_else(|| PathBuf::from(DEFAULT_VENV), PathBuf::from)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its endpoint URL, `http://127.0.0.1:PORT` (no trailing slash, as S3
    /// clients take it).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The environment an S3 client reading its settings from `AWS_*`
    /// variables (as `object_store`'s `AmazonS3Builder::from_env` does)
    /// needs to use this server with the test credentials, plain HTTP
    /// allowed. Buckets are addressed by path (`ENDPOINT/BUCKET/KEY`),
    /// that builder's default.
    pub fn env(&self) -> [(&'static str, String); 5] {
        [
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID.to_owned()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY.to_owned()),
            ("AWS_DEFAULT_REGION", REGION.to_owned()),
            ("AWS_ENDPOINT", self.endpoint()),
            ("AWS_ALLOW_HTTP", "true".to_owned()),
        ]
    }

    /// Creates bucket `name` (an unsigned `PUT /NAME`).
    pub fn create_bucket(&self, name: &str) -> io::Result<()> {
        self.put(&format!("/{name}"), &[])
    }

    /// Stores `data` as object `key` of `bucket` (an unsigned `PUT`); `key`
    /// is sent as given, so it must need no percent-encoding.
    pub fn put_object(&self, bucket: &str, key: &str, data: &[u8]) -> io::Result<()> {
        self.put(&format!("/{bucket}/{key}"), data)
    }

    fn put(&self, path: &str, body: &[u8]) -> io::Result<()> {
        // A form content type (what a bare client may default to) would
        // make moto's web framework take the body as form fields.
        let headers = [("Content-Type", "application/octet-stream")];
        let response = http::request("PUT", &format!("{}{path}", self.endpoint()), &headers, body)?;
        if response.status != 200 {
            return Err(io::Error::other(format!(
                "moto answered PUT {path} with {}: {}; its log:\n{}",
                response.status,
                String::from_utf8_lossy(&response.body),
                self.daemon.log_text()
            )));
        }
        Ok(())
    }
}
