//! `verityfs publish SRC_DIR DEST`: publish a directory tree as an image
//! (`docs/IMAGE.md`) into a directory or an S3 bucket, and print the one
//! digest readers must trust.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use verityfs::image::{publish_signed, ManifestSigner, Published};
use verityfs::signature::{self, Certificate, SigningKey};
use verityfs::{Digest, Error as LibError, HashAlgorithm, MerkleTreeParams};
use verityfs_remote::RemoteOptions;

use crate::cmd_sign::{load_cert, load_key};
use crate::commands::Command;
use crate::error::{Error, Result};
use crate::image_location::ImageLocation;
use crate::opts::{exactly, Args, Hint, Operand, Opt};
use crate::output::{print_stdout, quote};
use crate::tree_params::{block_size, hash_alg, salt, HasTree, TreeArgs};

/// The limit of an upload's requests (a third of it each, retries within
/// it): a part is 8 MiB with several in flight, which a slow uplink sends
/// in minutes, not in the seconds a read may wait.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(600);

/// Everything the options of `publish` ask for.
#[derive(Default)]
pub struct PublishArgs {
    tree: TreeArgs,
    /// `--key` and `--cert`: sign the manifest.
    key: Option<OsString>,
    cert: Option<OsString>,
}

impl HasTree for PublishArgs {
    fn tree(&mut self) -> &mut TreeArgs {
        &mut self.tree
    }
}

impl Args for PublishArgs {
    const OPTIONS: &'static [Opt<Self>] = &[
        hash_alg(),
        block_size(),
        salt(),
        Opt::<Self>::value(
            "key",
            "KEYFILE",
            "Sign the manifest with this private key (PEM, PKCS#8), as verityfs sign does",
            |a, v| {
                a.key = Some(v);
                Ok(())
            },
        )
        .hint(Hint::Path)
        .doc(
            "Readers may then mount the image trusting the certificate rather than the \
             digest; the digest printed is the same as without a signature.",
        ),
        Opt::<Self>::value(
            "cert",
            "CERTFILE",
            "Certificate (PEM) of the key; default: read it from KEYFILE",
            |a, v| {
                a.cert = Some(v);
                Ok(())
            },
        )
        .hint(Hint::Path),
    ];
    const OPERANDS: &'static [Operand] = &[
        Operand::one("SRC_DIR", "The directory tree to publish", Hint::Dir),
        Operand::one(
            "DEST",
            "Where to write the image: a directory (created if missing), or s3://BUCKET/PREFIX \
             (the bucket's store set by the AWS_* environment variables)",
            Hint::Dir,
        ),
    ];

    fn run(self, _: &Command, operands: Vec<OsString>) -> Result<()> {
        let [src, dest] = exactly(operands)?;
        let params = self.tree.params().map_err(|e| Error::msg(e.to_string()))?;
        let signing = self.signing_key()?;
        let sign = signing.as_ref().map(|(key, cert)| {
            move |alg: HashAlgorithm, digest: &Digest| {
                signature::sign_digest_with(alg, digest, key, cert).map_err(std::io::Error::other)
            }
        });
        let signer = sign.as_ref().map(|s| s as ManifestSigner<'_>);
        let location = ImageLocation::parse(&dest);
        let published = match &location {
            ImageLocation::Dir(dir) => publish_into(&src, dir, &params, signer)?,
            ImageLocation::S3(_) => publish_remote(&src, &location, &params, signer)?,
            ImageLocation::Http(_) => {
                return Err(Error::usage_msg(
                    "a web server is read-only: publish into a directory and serve it",
                ))
            }
        };
        let digest = format!("{}:{}\n", published.algorithm, published.digest);
        print_stdout(digest.as_bytes());
        Ok(())
    }
}

impl PublishArgs {
    /// The key and certificate to sign the manifest with, if asked: read
    /// before anything is published, so that a bad key costs nothing.
    fn signing_key(&self) -> Result<Option<(SigningKey, Certificate)>> {
        match (&self.key, &self.cert) {
            (Some(key), cert) => {
                let cert = load_cert(cert.as_ref().unwrap_or(key))?;
                Ok(Some((load_key(key)?, cert)))
            }
            (None, Some(_)) => Err(Error::usage_msg("--cert needs --key")),
            (None, None) => Ok(None),
        }
    }
}

/// Publishes `src` into the directory `dest` (its manifest signed by
/// `signer`), warning about what it leaves out.
fn publish_into(
    src: &OsStr,
    dest: &Path,
    params: &MerkleTreeParams,
    signer: Option<ManifestSigner<'_>>,
) -> Result<Published> {
    let published =
        publish_signed(Path::new(src), dest, params, signer).map_err(|e| publish_error(e, src))?;
    for path in &published.skipped {
        warn_skipped(path);
    }
    Ok(published)
}

/// Publishes `src` into a private staging directory under `$TMPDIR`, then
/// copies the image to the bucket at `location` (objects first, the
/// manifest last; objects already there are kept). The staging directory
/// is removed whatever happens.
fn publish_remote(
    src: &OsStr,
    location: &ImageLocation,
    params: &MerkleTreeParams,
    signer: Option<ManifestSigner<'_>>,
) -> Result<Published> {
    let url = location.name();
    let failed = |e: std::io::Error| Error::io(quote("can't publish to '", &url, "'"), &e);
    let options = RemoteOptions {
        timeout: UPLOAD_TIMEOUT,
        ..RemoteOptions::default()
    };
    let store = location.remote(&options).map_err(failed)?;
    let staging = tempfile::Builder::new()
        .prefix("verityfs-publish-")
        .tempdir()
        .map_err(|e| Error::io("can't create a staging directory", &e))?;
    if is_inside(staging.path(), Path::new(src)) {
        return Err(Error::msg(quote(
            "the staging directory '",
            staging.path().as_os_str(),
            "' is inside the source: set TMPDIR to a directory outside it",
        ))
        .context(quote("can't publish '", src, "'")));
    }
    let published = publish_into(src, staging.path(), params, signer)?;
    store.upload(staging.path()).map_err(failed)?;
    Ok(published)
}

/// Whether `dir` is `src` or beneath it (false if either cannot be
/// resolved: publishing then says why).
fn is_inside(dir: &Path, src: &Path) -> bool {
    match (dir.canonicalize(), src.canonicalize()) {
        (Ok(dir), Ok(src)) => dir.starts_with(src),
        _ => false,
    }
}

/// What a failed publish of `src` says: the file and `strerror` for a
/// system call's failure, else the library's message.
fn publish_error(e: LibError, src: &OsStr) -> Error {
    let failed = || quote("can't publish '", src, "'");
    match e {
        LibError::IoAt { path, source } => {
            Error::io(quote("'", path.as_os_str(), "'"), &source).context(failed())
        }
        LibError::Io(source) => Error::io(failed(), &source),
        other => Error::msg(other.to_string()).context(failed()),
    }
}

/// Says on stderr that `path` was left out of the image.
fn warn_skipped(path: &Path) {
    let line = quote(
        "WARNING: skipped '",
        path.as_os_str(),
        "': not a regular file, directory or symbolic link\n",
    );
    let _ = std::io::stderr().write_all(&line);
}
