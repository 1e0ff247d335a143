//! HTTP/1.1 message framing, shared by the proxy and the test client: a
//! message head read as raw bytes (so the proxy forwards it unchanged) and
//! its body streamed piece by piece, never held whole.

use std::io::{self, BufRead, Read, Write};

/// The longest head accepted: far above any head the clients under test
/// send, and a bound on what a broken peer makes us buffer.
const MAX_HEAD: u64 = 64 * 1024;

/// The longest chunk-size or trailer line accepted.
const MAX_LINE: u64 = 4096;

/// A request or response head: its bytes as received, and parsed.
pub(crate) struct Head {
    /// The head's bytes, from the start line to the empty line included.
    pub raw: Vec<u8>,
    /// The request line or the status line, without its line end.
    pub start: String,
    /// The header fields in order, names as sent.
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether the comma-separated list header `name` holds `token`.
    pub fn has_token(&self, name: &str, token: &str) -> bool {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .flat_map(|(_, v)| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    }

    /// A request head's method and target.
    pub fn method_and_target(&self) -> io::Result<(&str, &str)> {
        let mut words = self.start.split(' ');
        match (words.next(), words.next(), words.next()) {
            (Some(method), Some(target), Some(version))
                if !method.is_empty() && version.starts_with("HTTP/1.") =>
            {
                Ok((method, target))
            }
            _ => Err(invalid(format!("bad request line {:?}", self.start))),
        }
    }

    /// A response head's status code.
    pub fn status(&self) -> io::Result<u16> {
        let mut words = self.start.splitn(3, ' ');
        match (words.next(), words.next().map(str::parse)) {
            (Some(version), Some(Ok(status))) if version.starts_with("HTTP/1.") => Ok(status),
            _ => Err(invalid(format!("bad status line {:?}", self.start))),
        }
    }
}

/// Reads a message head; `None` if the peer closed the connection cleanly
/// before sending any of it (the end of a keep-alive connection).
pub(crate) fn read_head(src: &mut impl BufRead) -> io::Result<Option<Head>> {
    let mut raw = Vec::new();
    let mut lines = Vec::new();
    loop {
        let start = raw.len();
        let limit = MAX_HEAD.saturating_sub(start as u64);
        let read = src.by_ref().take(limit).read_until(b'\n', &mut raw)?;
        if read == 0 && raw.is_empty() {
            return Ok(None);
        }
        if !raw.ends_with(b"\n") {
            return Err(if raw.len() as u64 >= MAX_HEAD {
                invalid(format!("head longer than {MAX_HEAD} bytes"))
            } else {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed inside a head",
                )
            });
        }
        let line = trim_line_end(&raw[start..]);
        if line.is_empty() {
            // Empty lines before a request line are allowed and ignored.
            if lines.is_empty() {
                raw.clear();
                continue;
            }
            break;
        }
        let line = std::str::from_utf8(line).map_err(|_| invalid("head is not UTF-8"))?;
        lines.push(line.to_owned());
    }
    let mut lines = lines.into_iter();
    let start = lines.next().unwrap_or_default();
    let headers = lines
        .map(|line| match line.split_once(':') {
            Some((name, value)) if !name.is_empty() && !name.starts_with([' ', '\t']) => {
                Ok((name.to_owned(), value.trim().to_owned()))
            }
            _ => Err(invalid(format!("bad header line {line:?}"))),
        })
        .collect::<io::Result<_>>()?;
    Ok(Some(Head {
        raw,
        start,
        headers,
    }))
}

/// How a message's body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body.
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Up to the end of the connection (a response without a length).
    UntilClose,
}

/// The framing of the body following request head `head`.
pub(crate) fn request_framing(head: &Head) -> io::Result<Framing> {
    Ok(match explicit_framing(head)? {
        Some(framing) => framing,
        None => Framing::Empty,
    })
}

/// The framing of the body following response head `head`, the answer to
/// a request with method `method`.
pub(crate) fn response_framing(method: &str, head: &Head) -> io::Result<Framing> {
    let status = head.status()?;
    if method == "HEAD" || (100..200).contains(&status) || status == 204 || status == 304 {
        return Ok(Framing::Empty);
    }
    Ok(explicit_framing(head)?.unwrap_or(Framing::UntilClose))
}

/// The framing `Transfer-Encoding` or `Content-Length` give, if any.
fn explicit_framing(head: &Head) -> io::Result<Option<Framing>> {
    if let Some(coding) = head.header("transfer-encoding") {
        return if coding.trim().eq_ignore_ascii_case("chunked") {
            Ok(Some(Framing::Chunked))
        } else {
            Err(invalid(format!("unsupported transfer coding {coding:?}")))
        };
    }
    let mut length = None;
    for (_, value) in head
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
    {
        let value: u64 = value
            .parse()
            .map_err(|_| invalid(format!("bad Content-Length {value:?}")))?;
        if length.is_some_and(|l| l != value) {
            return Err(invalid("conflicting Content-Length headers"));
        }
        length = Some(value);
    }
    Ok(length.map(Framing::Length))
}

/// Where a body goes: its framing bytes (chunk-size lines, chunk ends,
/// trailers) and its data, separately, so a sink may alter or count the
/// data alone.
pub(crate) trait Sink {
    /// Takes framing bytes, as received.
    fn framing(&mut self, raw: &[u8]) -> io::Result<()>;
    /// Takes the next run of body data.
    fn data(&mut self, data: &mut [u8]) -> io::Result<()>;
}

/// A sink writing everything to `W` unchanged.
pub(crate) struct Forward<W>(pub W);

impl<W: Write> Sink for Forward<W> {
    fn framing(&mut self, raw: &[u8]) -> io::Result<()> {
        self.0.write_all(raw)
    }

    fn data(&mut self, data: &mut [u8]) -> io::Result<()> {
        self.0.write_all(data)
    }
}

/// Streams a body framed as `framing` from `src` to `sink`, through `buf`.
pub(crate) fn copy_body(
    framing: Framing,
    src: &mut impl BufRead,
    sink: &mut impl Sink,
    buf: &mut [u8],
) -> io::Result<()> {
    match framing {
        Framing::Empty => Ok(()),
        Framing::Length(length) => copy_data(src, length, sink, buf),
        Framing::UntilClose => loop {
            let read = src.read(buf)?;
            if read == 0 {
                return Ok(());
            }
            sink.data(&mut buf[..read])?;
        },
        Framing::Chunked => loop {
            let line = read_line(src)?;
            sink.framing(&line)?;
            let size = trim_line_end(&line);
            let size = size.split(|&b| b == b';').next().unwrap_or_default();
            let size = std::str::from_utf8(size)
                .ok()
                .and_then(|s| u64::from_str_radix(s.trim(), 16).ok())
                .ok_or_else(|| invalid(format!("bad chunk size line {line:?}")))?;
            if size == 0 {
                // Trailer fields, up to an empty line.
                loop {
                    let line = read_line(src)?;
                    sink.framing(&line)?;
                    if trim_line_end(&line).is_empty() {
                        return Ok(());
                    }
                }
            }
            copy_data(src, size, sink, buf)?;
            let end = read_line(src)?;
            if !trim_line_end(&end).is_empty() {
                return Err(invalid("chunk data longer than its size"));
            }
            sink.framing(&end)?;
        },
    }
}

/// Streams exactly `length` bytes from `src` to `sink`.
fn copy_data(
    src: &mut impl BufRead,
    mut length: u64,
    sink: &mut impl Sink,
    buf: &mut [u8],
) -> io::Result<()> {
    while length > 0 {
        let want = buf.len().min(usize::try_from(length).unwrap_or(usize::MAX));
        let read = src.read(&mut buf[..want])?;
        if read == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed inside a body",
            ));
        }
        sink.data(&mut buf[..read])?;
        length -= read as u64;
    }
    Ok(())
}

/// Reads one line of a chunked body, line end included.
fn read_line(src: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    src.by_ref().take(MAX_LINE).read_until(b'\n', &mut line)?;
    if !line.ends_with(b"\n") {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "chunked body cut or with an overlong line",
        ));
    }
    Ok(line)
}

/// `line` without its `\n` or `\r\n`.
fn trim_line_end(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// An `InvalidData` error: the peer broke the protocol.
pub(crate) fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Collects data only, to compare with the framing-preserving copy.
    struct Data(Vec<u8>);

    impl Sink for Data {
        fn framing(&mut self, _raw: &[u8]) -> io::Result<()> {
            Ok(())
        }

        fn data(&mut self, data: &mut [u8]) -> io::Result<()> {
            self.0.extend_from_slice(data);
            Ok(())
        }
    }

    const MESSAGE: &[u8] =
        b"\r\nPUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
        5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nTrailer: t\r\n\r\nGET / HTTP/1.1\r\n\r\n";

    #[test]
    fn chunked_body_is_forwarded_unchanged_and_decoded() {
        let mut src = MESSAGE;
        let head = read_head(&mut src).unwrap().unwrap();
        assert_eq!(head.method_and_target().unwrap(), ("PUT", "/b/k"));
        assert!(head.raw.starts_with(b"PUT"));
        assert_eq!(request_framing(&head).unwrap(), Framing::Chunked);
        let body_start = src;
        let mut forwarded = Forward(Vec::new());
        copy_body(Framing::Chunked, &mut src, &mut forwarded, &mut [0; 3]).unwrap();
        assert_eq!(forwarded.0, &body_start[..body_start.len() - src.len()]);
        let mut data = Data(Vec::new());
        copy_body(
            Framing::Chunked,
            &mut &body_start[..],
            &mut data,
            &mut [0; 3],
        )
        .unwrap();
        assert_eq!(data.0, b"hello, world");
        // The next request on the connection starts right after.
        let next = read_head(&mut src).unwrap().unwrap();
        assert_eq!(next.start, "GET / HTTP/1.1");
        assert!(read_head(&mut src).unwrap().is_none());
    }

    #[test]
    fn framing_follows_method_status_and_headers() {
        let head = |text: &str| read_head(&mut text.as_bytes()).unwrap().unwrap();
        let ok = head("HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n");
        assert_eq!(response_framing("GET", &ok).unwrap(), Framing::Length(12));
        assert_eq!(response_framing("HEAD", &ok).unwrap(), Framing::Empty);
        let no_length = head("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(
            response_framing("GET", &no_length).unwrap(),
            Framing::UntilClose
        );
        let not_modified = head("HTTP/1.1 304 Not Modified\r\nContent-Length: 12\r\n\r\n");
        assert_eq!(
            response_framing("GET", &not_modified).unwrap(),
            Framing::Empty
        );
        let conflicting = head("PUT / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n");
        assert!(request_framing(&conflicting).is_err());
        assert!(
            head("GET / HTTP/1.1\r\nConnection: Keep-Alive, Close\r\n\r\n")
                .has_token("connection", "close")
        );
    }

    #[test]
    fn broken_heads_are_errors() {
        let error = |text: &[u8]| read_head(&mut &text[..]).err().unwrap().kind();
        assert_eq!(
            error(b"GET / HTTP/1.1\r\nHost"),
            io::ErrorKind::UnexpectedEof
        );
        assert_eq!(
            error(b"GET / HTTP/1.1\r\n folded\r\n\r\n"),
            io::ErrorKind::InvalidData
        );
        let long = [b"GET / HTTP/1.1\r\nX: ".as_slice(), &[b'a'; 70_000]].concat();
        assert_eq!(error(&long), io::ErrorKind::InvalidData);
    }
}
