//! An image on a web server or in an S3 bucket, as a
//! [`verityfs::image::Store`].

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};

use object_store::aws::AmazonS3Builder;
use object_store::http::HttpBuilder;
use object_store::path::Path;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};
use verityfs::image::{Store, MANIFEST_NAME};
use verityfs::Source;

use crate::checked_http::CheckedConnector;
use crate::chunks::Chunks;
use crate::credentials::refuse_credentials;
use crate::disk::DiskCache;
use crate::errors::io_error;
use crate::object::Object;
use crate::options::RemoteOptions;
use crate::runtime::Runtime;

/// What the objects of one store share.
pub(crate) struct Remote {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) rt: Runtime,
    pub(crate) chunks: Arc<Chunks>,
    pub(crate) options: RemoteOptions,
    /// A number per object path: two files with the same contents share
    /// one object, and so its chunks.
    ids: Mutex<HashMap<String, u64>>,
}

/// An image read over the network.
pub struct RemoteStore {
    remote: Arc<Remote>,
    /// Where the image is in the store (S3: the key prefix).
    prefix: Path,
    /// The disk cache, and the name the manifest has there.
    disk: Option<(Arc<DiskCache>, Option<String>)>,
}

impl RemoteStore {
    /// The image at `url` (`http://` or `https://`), read with range
    /// requests from any static web server.
    pub fn http(url: &str, options: RemoteOptions) -> io::Result<Self> {
        refuse_credentials(url)?;
        let store = HttpBuilder::new()
            .with_url(url.trim_end_matches('/'))
            .with_http_connector(CheckedConnector::default())
            .with_client_options(client_options(&options))
            .with_retry(retry_config(&options))
            .build()
            .map_err(invalid)?;
        Self::new(Arc::new(store), Path::default(), options)
    }

    /// The image at `url` (`s3://BUCKET/PREFIX`), read from an
    /// S3-compatible store configured by the usual environment variables
    /// (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_ALLOW_HTTP`...).
    pub fn s3(url: &str, options: RemoteOptions) -> io::Result<Self> {
        let (bucket, prefix) = parse_s3(url)?;
        let store = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_http_connector(CheckedConnector::default())
            .with_client_options(client_options(&options))
            .with_retry(retry_config(&options))
            .build()
            .map_err(invalid)?;
        Self::new(Arc::new(store), prefix, options)
    }

    fn new(store: Arc<dyn ObjectStore>, prefix: Path, options: RemoteOptions) -> io::Result<Self> {
        let remote = Remote {
            store,
            rt: Runtime::new()?,
            chunks: Arc::new(Chunks::new(options.memory)),
            options,
            ids: Mutex::default(),
        };
        Ok(RemoteStore {
            remote: Arc::new(remote),
            prefix,
            disk: None,
        })
    }

    /// Keeps what is fetched in the directory `dir`, at most `max` bytes:
    /// objects are named by their contents and shared by every image
    /// cached there; the manifest is kept only if it must have the digest
    /// `manifest` (`ALG:HEX`), under that name, so that a republished image
    /// never meets its old manifest. An error if `dir` does not belong to
    /// the daemon's user or is writable by others; a file of the cache that
    /// cannot be used later is logged, and its object read from the
    /// network.
    pub fn with_cache(
        mut self,
        dir: &std::path::Path,
        max: u64,
        manifest: Option<&str>,
    ) -> io::Result<Self> {
        let name = manifest.map(|m| format!("manifest-{}", m.replace(':', "-")));
        let valid = |n: &String| n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !name.iter().all(valid) {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        self.disk = Some((DiskCache::open(dir, max)?, name));
        Ok(self)
    }

    /// The path in the store of the image's file `path`.
    pub(crate) fn path(&self, path: &str) -> Path {
        path.split('/')
            .fold(self.prefix.clone(), |p, part| p.join(part))
    }

    pub(crate) fn remote(&self) -> &Remote {
        &self.remote
    }
}

impl Store for RemoteStore {
    fn open(&self, path: &str) -> io::Result<Arc<dyn Source>> {
        let disk = self.disk.as_ref().and_then(|(cache, manifest)| {
            let name = match manifest {
                _ if path != MANIFEST_NAME => path.replace('/', "-"),
                Some(manifest) => manifest.clone(),
                None => return None,
            };
            // The file is read all the same, from the network.
            cache
                .object(&name)
                .inspect_err(|e| tracing::warn!("disk cache: not used for {path}: {e}"))
                .ok()
        });
        let path = self.path(path);
        let id = {
            let mut ids = self.remote.ids.lock().unwrap_or_else(|e| e.into_inner());
            let next = ids.len() as u64;
            *ids.entry(path.to_string()).or_insert(next)
        };
        Ok(Arc::new(Object::new(self.remote.clone(), path, id, disk)))
    }
}

/// The HTTP client's timeouts, within the store's limit.
fn client_options(options: &RemoteOptions) -> ClientOptions {
    ClientOptions::new()
        .with_allow_http(true)
        .with_connect_timeout(options.connect_timeout())
        .with_timeout(options.request_timeout())
        .with_pool_max_idle_per_host(64)
}

/// Retries with exponential backoff, within the store's limit.
fn retry_config(options: &RemoteOptions) -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig::default(),
        max_retries: 3,
        retry_timeout: options.timeout * 2 / 3,
    }
}

/// `s3://BUCKET/PREFIX` as the bucket and the prefix.
fn parse_s3(url: &str) -> io::Result<(&str, Path)> {
    let rest = url
        .get(..5)
        .filter(|s| s.eq_ignore_ascii_case("s3://"))
        .map(|_| &url[5..])
        .ok_or_else(|| invalid_url(url))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(invalid_url(url));
    }
    let prefix = Path::parse(prefix.trim_matches('/')).map_err(|_| invalid_url(url))?;
    Ok((bucket, prefix))
}

fn invalid_url(url: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{url}: not an s3://BUCKET/PREFIX URL"),
    )
}

fn invalid(e: object_store::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, io_error(e).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_urls_give_a_bucket_and_a_prefix() {
        let (bucket, prefix) = parse_s3("s3://b/some/prefix/").unwrap();
        assert_eq!((bucket, prefix.as_ref()), ("b", "some/prefix"));
        let (bucket, prefix) = parse_s3("S3://b").unwrap();
        assert_eq!((bucket, prefix.as_ref()), ("b", ""));
        assert!(parse_s3("s3:///x").is_err());
        assert!(parse_s3("http://b/x").is_err());
    }
}
