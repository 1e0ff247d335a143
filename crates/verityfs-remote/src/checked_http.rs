//! object_store's HTTP client, with the responses it cannot take refused
//! or cut before it sees them.
//!
//! object_store computes the end of a `Content-Range` as its last byte
//! plus one: a server that names the largest 64-bit offset as the last
//! byte makes that overflow, which panics where overflow checks are on
//! (and wraps otherwise). Such a response is refused here with an error,
//! as a server's other lies are.
//!
//! It also reads the body of an error response (a 404, a 5xx) whole into
//! the error's message, however large: a server could make the daemon hold
//! gigabytes, and write them to its log. Only the start of such a body is
//! kept, enough for the reason a store gives (S3's error code).

use async_trait::async_trait;
use futures_util::StreamExt;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpService,
    ReqwestConnector,
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
        let response = self.0.execute(request).await?;
        if !response.status().is_success() {
            return Ok(cut_error_body(response).await);
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

/// `response` with its body cut to its first [`ERROR_BODY_BYTES`], as
/// text that a log can show (no control characters, valid UTF-8). The rest
/// is never read: the connection is dropped with it.
async fn cut_error_body(response: HttpResponse) -> HttpResponse {
    let (parts, body) = response.into_parts();
    let mut frames = body.bytes_stream();
    let mut kept = Vec::new();
    while kept.len() < ERROR_BODY_BYTES {
        match frames.next().await {
            Some(Ok(bytes)) => {
                let room = ERROR_BODY_BYTES - kept.len();
                kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
            _ => break,
        }
    }
    let text: String = String::from_utf8_lossy(&kept)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    HttpResponse::from_parts(parts, text.into())
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

#[cfg(test)]
mod tests {
    use super::last_byte;

    #[test]
    fn the_last_byte_of_a_range() {
        assert_eq!(last_byte("bytes 0-4095/8192"), Some(4095));
        assert_eq!(last_byte(" bytes 5-18446744073709551615/*"), Some(u64::MAX));
        assert_eq!(last_byte("bytes */8192"), None);
        assert_eq!(last_byte("bytes 0-99999999999999999999/1"), None);
    }
}
