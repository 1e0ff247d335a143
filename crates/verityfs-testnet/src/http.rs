//! A minimal blocking HTTP/1.1 client on std's `TcpStream`, for tests
//! that check what a server or the proxy answers without an async
//! runtime. Every socket has a timeout (10 s unless set), so a test
//! against a stalled server fails instead of hanging.

use std::io::{self, BufReader, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::ops::RangeInclusive;
use std::time::Duration;

use crate::wire::{self, Sink};

/// The read and write timeout of a new [`Connection`].
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// A response, its body read whole.
#[derive(Clone, Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The header fields in order, names as sent.
    pub headers: Vec<(String, String)>,
    /// The body, after any chunked framing is removed.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One client connection, kept alive across requests.
pub struct Connection {
    stream: BufReader<TcpStream>,
    host: String,
}

impl Connection {
    /// Connects to `addr`, with [`TIMEOUT`] for reads and writes.
    pub fn open(addr: SocketAddr) -> io::Result<Connection> {
        let stream = TcpStream::connect_timeout(&addr, TIMEOUT)?;
        stream.set_nodelay(true)?;
        let connection = Connection {
            stream: BufReader::new(stream),
            host: addr.to_string(),
        };
        connection.set_timeout(TIMEOUT)?;
        Ok(connection)
    }

    /// Sets the read and write timeout.
    pub fn set_timeout(&self, timeout: Duration) -> io::Result<()> {
        let stream = self.stream.get_ref();
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))
    }

    /// Sends a request for `path` (with any query) and reads the response.
    /// `Host` and, for methods other than GET and HEAD, `Content-Length`
    /// are added to `headers`.
    pub fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Response> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.host);
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if !matches!(method, "GET" | "HEAD") || !body.is_empty() {
            head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        let stream = self.stream.get_mut();
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)?;

        let head = wire::read_head(&mut self.stream)?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed, no response",
            )
        })?;
        let status = head.status()?;
        let framing = wire::response_framing(method, &head)?;
        let mut body = Collect(Vec::new());
        wire::copy_body(framing, &mut self.stream, &mut body, &mut [0; 64 * 1024])?;
        Ok(Response {
            status,
            headers: head.headers,
            body: body.0,
        })
    }
}

/// Collects a body's data, dropping its framing.
struct Collect(Vec<u8>);

impl Sink for Collect {
    fn framing(&mut self, _raw: &[u8]) -> io::Result<()> {
        Ok(())
    }

    fn data(&mut self, data: &mut [u8]) -> io::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }
}

/// GETs `url` (`http://HOST:PORT/PATH`) on a new connection, with a
/// `Range: bytes=FIRST-LAST` header if `range` is given.
pub fn get(url: &str, range: Option<RangeInclusive<u64>>) -> io::Result<Response> {
    match range {
        Some(range) => {
            let value = format!("bytes={}-{}", range.start(), range.end());
            request("GET", url, &[("Range", &value)], &[])
        }
        None => request("GET", url, &[], &[]),
    }
}

/// Sends one request to `url` (`http://HOST:PORT/PATH`) on a new
/// connection; see [`Connection::send`].
pub fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<Response> {
    let (addr, path) = split_url(url)?;
    Connection::open(addr)?.send(method, path, headers, body)
}

/// The address and path of an `http://` URL.
fn split_url(url: &str) -> io::Result<(SocketAddr, &str)> {
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not an http URL: {url}"),
        )
    };
    let rest = url.strip_prefix("http://").ok_or_else(bad)?;
    let (authority, path) = match rest.find('/') {
        Some(slash) => rest.split_at(slash),
        None => (rest, "/"),
    };
    let addr = authority
        .to_socket_addrs()
        .map_err(|_| bad())?
        .next()
        .ok_or_else(bad)?;
    Ok((addr, path))
}
