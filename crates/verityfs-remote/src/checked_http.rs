//! object_store's HTTP client, with the responses it cannot take refused
//! or cut before it sees them.
//!
//! object_store computes the end of a `Content-Range` as its last byte
//! plus one: a server that names the largest 64-bit offset as the last
//! byte makes that overflow, which panics where overflow checks are on
//! (and wraps otherwise). Such a response is refused here with an error,
//! as a server's other lies are.
//!
//! It also reads some bodies whole, however large: an error response's
//! into the error's message (a server could make the daemon hold
//! gigabytes, and write them to its log), and the answers to S3's other
//! requests (a multipart upload's), which it parses. Only the start of an
//! error's body is kept, enough for the reason a store gives (S3's error
//! code), and none of one that object_store retries (a stalled body would
//! cost a timeout before each retry); an answer to anything but a `GET`
//! larger than 1 MiB is refused. The bodies of `GET`s, the ranges of
//! objects, are bounded where they are read (`fetch`).

use async_trait::async_trait;
use futures_util::StreamExt;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService, ReqwestConnector,
};
use object_store::ClientOptions;

/// Connects clients that refuse a `Content-Range` object_store cannot take.
#[derive(Debug, Default)]
pub(crate) struct CheckedConnector(ReqwestConnector);

impl HttpConnector for CheckedConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(Checked(self.0.connect(options)?)))
    }
}

#[derive(Debug)]
struct Checked(HttpClient);

#[async_trait]
impl HttpService for Checked {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let get = request.method().as_str() == "GET";
        let response = self.0.execute(request).await?;
        let status = response.status();
        if retried(status.as_u16()) {
            let (parts, _) = response.into_parts();
            return Ok(HttpResponse::from_parts(parts, Vec::new().into()));
        }
        if !status.is_success() {
            return Ok(cut_error_body(response).await);
        }
        if !get {
            return small_answer(response).await;
        }
        let range = response.headers().get("content-range");
        match range.and_then(|v| v.to_str().ok()).and_then(last_byte) {
            Some(u64::MAX) => Err(HttpError::new(HttpErrorKind::Decode, UnusableRange)),
            _ => Ok(response),
        }
    }
}

/// The most bytes of an error response's body kept for its message.
const ERROR_BODY_BYTES: usize = 1024;

/// The largest answer to a request other than a `GET` taken.
const ANSWER_BYTES: usize = 1 << 20;

/// Whether object_store retries a response with `status` (a server error,
/// too many requests, a request timeout).
fn retried(status: u16) -> bool {
    status >= 500 || status == 429 || status == 408
}

/// `response` with its body cut to its first [`ERROR_BODY_BYTES`], as
/// text that a log can show ([`printable`]). The rest is never read: the
/// connection is dropped with it.
async fn cut_error_body(response: HttpResponse) -> HttpResponse {
    let (parts, body) = response.into_parts();
    let (kept, _) = read_at_most(body, ERROR_BODY_BYTES).await;
    HttpResponse::from_parts(parts, printable(&kept).into())
}

/// `bytes` as text a log or a terminal shows as it is: valid UTF-8, with
/// control characters, line separators and the marks that reorder text
/// (bidirectional overrides) made spaces.
fn printable(bytes: &[u8]) -> String {
    let hidden = |c: char| {
        c.is_control()
            || matches!(c, '\u{61c}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}')
            || matches!(c, '\u{2066}'..='\u{2069}' | '\u{feff}')
    };
    String::from_utf8_lossy(bytes)
        .chars()
        .map(|c| if hidden(c) { ' ' } else { c })
        .collect()
}

/// `response` read whole, if its body has at most [`ANSWER_BYTES`].
async fn small_answer(response: HttpResponse) -> Result<HttpResponse, HttpError> {
    let (parts, body) = response.into_parts();
    match read_at_most(body, ANSWER_BYTES).await {
        (kept, Ending::Whole) => Ok(HttpResponse::from_parts(parts, kept.into())),
        (_, Ending::Longer) => Err(HttpError::new(HttpErrorKind::Decode, TooLarge)),
        (_, Ending::Failed(e)) => Err(e),
    }
}

/// How reading a body stopped.
enum Ending {
    Whole,
    Longer,
    Failed(HttpError),
}

/// The first bytes of `body`, at most `limit`, and why the read stopped.
async fn read_at_most(body: HttpResponseBody, limit: usize) -> (Vec<u8>, Ending) {
    let mut frames = body.bytes_stream();
    let mut kept = Vec::new();
    loop {
        match frames.next().await {
            None => return (kept, Ending::Whole),
            Some(Err(e)) => return (kept, Ending::Failed(e)),
            Some(Ok(bytes)) => {
                let room = limit - kept.len();
                if bytes.len() > room {
                    kept.extend_from_slice(&bytes[..room]);
                    return (kept, Ending::Longer);
                }
                kept.extend_from_slice(&bytes);
            }
        }
    }
}

/// The last byte a `Content-Range` of the form `bytes A-B/SIZE` names.
fn last_byte(range: &str) -> Option<u64> {
    let (range, _) = range.trim().strip_prefix("bytes ")?.split_once('/')?;
    range.split_once('-')?.1.parse().ok()
}

/// The error of a response refused.
#[derive(Debug)]
struct UnusableRange;

impl std::fmt::Display for UnusableRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the server answered with a Content-Range ending at the largest offset")
    }
}

impl std::error::Error for UnusableRange {}

/// The error of an answer too large to take.
#[derive(Debug)]
struct TooLarge;

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the server's answer is larger than {ANSWER_BYTES} bytes")
    }
}

impl std::error::Error for TooLarge {}

#[cfg(test)]
mod tests {
    use super::{last_byte, printable};

    #[test]
    fn an_error_page_is_kept_as_printable_text() {
        let page = "<Error>\x1b[2J\r\nNo\u{202e}Such\u{2028}Key\u{2067}\u{7f}</Error>\u{e9}\u{61c}\u{feff}";
        assert_eq!(
            printable(page.as_bytes()),
            "<Error> [2J  No Such Key  </Error>\u{e9}  "
        );
        assert_eq!(printable(b"cut \xe2\x80"), "cut \u{fffd}");
    }

    #[test]
    fn the_last_byte_of_a_range() {
        assert_eq!(last_byte("bytes 0-4095/8192"), Some(4095));
        assert_eq!(last_byte(" bytes 5-18446744073709551615/*"), Some(u64::MAX));
        assert_eq!(last_byte("bytes */8192"), None);
        assert_eq!(last_byte("bytes 0-99999999999999999999/1"), None);
    }
}
