//! object_store's HTTP client, with the responses it cannot take refused
//! before it sees them.
//!
//! object_store computes the end of a `Content-Range` as its last byte
//! plus one: a server that names the largest 64-bit offset as the last
//! byte makes that overflow, which panics where overflow checks are on
//! (and wraps otherwise). Such a response is refused here with an error,
//! as a server's other lies are.

use async_trait::async_trait;
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
        let range = response.headers().get("content-range");
        match range.and_then(|v| v.to_str().ok()).and_then(last_byte) {
            Some(u64::MAX) => Err(HttpError::new(HttpErrorKind::Decode, UnusableRange)),
            _ => Ok(response),
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
