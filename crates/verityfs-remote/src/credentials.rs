//! User names and passwords in `http(s)://` URLs: refused.
//!
//! They would never be sent (the store's client does not use them), and
//! the URL names the mount, which every user sees in `/proc/mounts`. URLs
//! are read as the store's client reads them (the `url` crate), so that
//! no spelling it accepts (`http:///user:pw@host/`, a tab before the host)
//! slips through, and a `@` in a path or query is no credential.

use std::io;

use url::Url;

/// Refuses `url` if it holds a user name or a password; the error does not
/// repeat them. A URL that does not parse is left to the store to refuse.
pub(crate) fn refuse_credentials(url: &str) -> io::Result<()> {
    match Url::parse(url) {
        Ok(parsed) if has_credentials(&parsed) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: a user name or password in the URL is not supported \
                 (it would be shown to every user as the mount's name)",
                without_credentials(url)
            ),
        )),
        _ => Ok(()),
    }
}

/// `url` with any user name and password taken out, to be shown.
pub fn without_credentials(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut parsed) if has_credentials(&parsed) => {
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}

fn has_credentials(url: &Url) -> bool {
    !url.username().is_empty() || url.password().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_with_credentials_are_refused_without_showing_them() {
        for (url, shown) in [
            ("http://alice:s3cret@h:81/img", "http://h:81/img"),
            ("https://alice@h/i", "https://h/i"),
            ("HTTP:///alice:s3cret@h/img", "http://h/img"),
            ("https:///alice@h/i", "https://h/i"),
            ("http://\t/alice:s3cret@h/img", "http://h/img"),
            ("http://:s3cret@h/", "http://h/"),
        ] {
            let e = refuse_credentials(url).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            let message = e.to_string();
            assert!(
                message.starts_with(&format!("{shown}:")),
                "{url}: {message}"
            );
            assert!(!message.contains("alice") && !message.contains("s3cret"));
            assert_eq!(without_credentials(url), shown);
        }
        for url in [
            "http://h/img",
            "https://h:8443/a@b/c",
            "http://h/i?x=a@b",
            "http://h\\@x/img",
        ] {
            refuse_credentials(url).unwrap();
            assert_eq!(without_credentials(url), url);
        }
    }
}
