//! Where `verityfs mount --digest` finds an image, and where `verityfs
//! publish` writes one: a local directory, a web server (read only) or an
//! S3 bucket.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::Arc;

use verityfs::image::{DirStore, Store};
use verityfs_remote::{without_credentials, RemoteOptions, RemoteStore};

use crate::error::{Error, Result};
use crate::output::quote;

/// Where a remote image's fetched bytes are kept (`--cache-dir`).
#[derive(Debug)]
pub struct DiskCacheArgs {
    /// The directory.
    pub dir: PathBuf,
    /// The most bytes it may take.
    pub max: u64,
}

/// An image's location, as given on the command line.
#[derive(Debug, PartialEq, Eq)]
pub enum ImageLocation {
    /// A local directory.
    Dir(PathBuf),
    /// An `http://` or `https://` URL.
    Http(String),
    /// An `s3://BUCKET/PREFIX` URL.
    S3(String),
}

impl ImageLocation {
    /// The location `arg` names: a URL by its scheme, else a directory.
    pub fn parse(arg: &OsStr) -> Self {
        let text = arg.to_str().unwrap_or_default();
        let scheme = |s: &str| {
            text.get(..s.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(s))
        };
        if scheme("http://") || scheme("https://") {
            ImageLocation::Http(text.to_owned())
        } else if scheme("s3://") {
            ImageLocation::S3(text.to_owned())
        } else {
            ImageLocation::Dir(PathBuf::from(arg))
        }
    }

    /// How the image's files are read (a remote image: within `remote`'s
    /// limits, keeping what it fetches in `cache` if given, the manifest
    /// too if it has the digest `manifest`).
    pub fn store(
        &self,
        remote: &RemoteOptions,
        cache: Option<&DiskCacheArgs>,
        manifest: Option<&str>,
    ) -> Result<Arc<dyn Store>> {
        let opened: std::io::Result<Arc<dyn Store>> = match (self, cache) {
            (ImageLocation::Dir(dir), _) => DirStore::new(dir).map(|s| Arc::new(s) as _),
            (_, None) => self.remote(remote).map(|s| Arc::new(s) as _),
            (_, Some(cache)) => self.remote(remote).and_then(|s| {
                let s = s.with_cache(&cache.dir, cache.max, manifest)?;
                Ok(Arc::new(s) as _)
            }),
        };
        let shown = match self {
            ImageLocation::Http(url) => without_credentials(url).into(),
            _ => self.name(),
        };
        opened.map_err(|e| Error::io(quote("can't open image '", &shown, "'"), &e))
    }

    /// The remote store of an `http(s)://` or `s3://` location.
    pub fn remote(&self, options: &RemoteOptions) -> std::io::Result<RemoteStore> {
        match self {
            ImageLocation::Http(url) => RemoteStore::http(url, options.clone()),
            ImageLocation::S3(url) => RemoteStore::s3(url, options.clone()),
            ImageLocation::Dir(_) => Err(std::io::ErrorKind::Unsupported.into()),
        }
    }

    /// The name of the mount (its `fsname`).
    pub fn name(&self) -> OsString {
        match self {
            ImageLocation::Dir(dir) => std::fs::canonicalize(dir)
                .unwrap_or_else(|_| dir.clone())
                .into_os_string(),
            ImageLocation::Http(url) | ImageLocation::S3(url) => url.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_by_scheme_else_directories() {
        let parse = |s: &str| ImageLocation::parse(OsStr::new(s));
        assert_eq!(
            parse("https://h/i"),
            ImageLocation::Http("https://h/i".into())
        );
        assert_eq!(
            parse("HTTP://h/i"),
            ImageLocation::Http("HTTP://h/i".into())
        );
        assert_eq!(parse("s3://b/p"), ImageLocation::S3("s3://b/p".into()));
        assert_eq!(parse("images/x"), ImageLocation::Dir("images/x".into()));
        assert_eq!(parse("https:x"), ImageLocation::Dir("https:x".into()));
    }
}
