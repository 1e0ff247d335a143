//! Copies an image from a local directory (as `verityfs publish` writes it)
//! into an object store.

use std::fs::{self, File};
use std::io::{self, Read};
use std::sync::Arc;

use bytes::Bytes;
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::io::AsyncWriteExt;
use verityfs::image::MANIFEST_NAME;

use crate::errors::io_error;
use crate::store::RemoteStore;

/// The size of each part of a multipart upload (and of each read of the
/// local file).
const PART: usize = 8 << 20;

/// What [`RemoteStore::upload`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Uploaded {
    /// Objects written.
    pub objects: u64,
    /// Objects already in the store with the same size, left as they are.
    pub kept: u64,
    /// Bytes written.
    pub bytes: u64,
}

impl RemoteStore {
    /// Copies the image in the directory `dir` into the store: the objects
    /// first, then the manifest, so that a reader never finds a manifest
    /// naming an object that is not there yet. An object already there
    /// with the same size is kept (objects are named by their contents'
    /// digest, and readers verify them anyway).
    pub fn upload(&self, dir: &std::path::Path) -> io::Result<Uploaded> {
        let mut done = Uploaded::default();
        let objects = dir.join(verityfs::image::OBJECTS_DIR);
        let mut names: Vec<_> = fs::read_dir(&objects)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<_>>()?;
        names.sort();
        for name in names {
            let name = name.to_str().ok_or(io::ErrorKind::InvalidData)?;
            let local = objects.join(name);
            let remote = self.path(&format!("{}/{name}", verityfs::image::OBJECTS_DIR));
            if self.has(&remote, fs::symlink_metadata(&local)?.len())? {
                done.kept += 1;
                continue;
            }
            done.bytes += self.put_file(&local, remote)?;
            done.objects += 1;
        }
        done.bytes += self.put_file(&dir.join(MANIFEST_NAME), self.path(MANIFEST_NAME))?;
        Ok(done)
    }

    /// Whether the object at `path` exists with `size` bytes.
    fn has(&self, path: &Path, size: u64) -> io::Result<bool> {
        let remote = self.remote();
        remote.rt.block_on(remote.options.timeout, async {
            match remote.store.head(path).await {
                Ok(meta) => Ok(meta.size == size),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(io_error(e)),
            }
        })
    }

    /// Writes the local regular file `local` to `path` (in parts when it
    /// is large); returns its size. A write that finds nothing at its
    /// path (a `PUT` creates it) found no bucket.
    fn put_file(&self, local: &std::path::Path, path: Path) -> io::Result<u64> {
        let mut file = File::open(local)?;
        if !file.metadata()?.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a regular file",
            ));
        }
        let store: Arc<dyn ObjectStore> = self.remote().store.clone();
        let written: io::Result<u64> = self.remote().rt.run(async move {
            let mut writer = BufWriter::with_capacity(store, path, PART);
            let mut total = 0;
            loop {
                let mut part = vec![0; PART];
                let n = read_full(&mut file, &mut part)?;
                if n == 0 {
                    break;
                }
                part.truncate(n);
                total += n as u64;
                writer.put(Bytes::from(part)).await.map_err(io_error)?;
            }
            writer.shutdown().await?;
            Ok(total)
        });
        written.map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => {
                io::Error::new(io::ErrorKind::NotFound, "the bucket does not exist")
            }
            _ => e,
        })
    }
}

/// Reads until `buf` is full or the file ends.
fn read_full(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            read => n += read,
        }
    }
    Ok(n)
}
