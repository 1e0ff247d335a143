//! `verityfs mount BACKING MOUNTPOINT`: serve a backing directory with
//! fs-verity semantics, in the foreground, until unmounted or interrupted;
//! `verityfs mount --digest=DIGEST IMAGE MOUNTPOINT`: serve an image
//! (written by `verityfs publish`) read-only, verified against DIGEST.

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use verityfs::image::{ManifestTrust, Store};
use verityfs::safe_dir::{open_dir, open_dir_following, OpenedDir, PathError};
use verityfs::signature::Certificate;
use verityfs::{Error as LibError, ExpectedDigest};
use verityfs_fuse::{ImageFs, MountOptions};
use verityfs_remote::RemoteOptions;

use crate::commands::Command;
use crate::error::{Error, Result};
use crate::image_location::{DiskCacheArgs, ImageLocation};
use crate::opts::{exactly, Args, Hint, Operand, Opt};
use crate::output::quote;

/// Mount options (`-o`) accepted and ignored because they are the default
/// or are for mount(8) and /etc/fstab, so that fstab lines written for
/// other FUSE filesystems work (`x-*` and `comment=` too).
const IGNORED: &[&str] = &[
    "rw", "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group", "nofail",
    "_netdev",
];

/// Everything the options of `mount` ask for.
#[derive(Default)]
pub struct MountArgs {
    options: MountOptions,
    create: bool,
    /// The image's trusted digest: the source is an image.
    digest: Option<ExpectedDigest>,
    /// The `--trusted-cert` certificates.
    trusted: Vec<Certificate>,
    /// The first option given that only a backing directory takes.
    backing_only: Option<&'static str>,
    /// The limits of a remote image.
    remote: RemoteOptions,
    /// The first option given that only a remote image takes.
    remote_only: Option<&'static str>,
    /// `--cache-dir`, and `--cache-max` (default 1 GiB).
    disk_cache: Option<PathBuf>,
    cache_max: Option<u64>,
}

impl Args for MountArgs {
    const OPTIONS: &'static [Opt<Self>] = &[
        Opt::<Self>::value(
            "options",
            "OPTIONS",
            "Comma-separated mount options",
            |a, v| {
                let text = v.to_string_lossy();
                let mut options = text.split(',').filter(|o| !o.is_empty());
                options.try_for_each(|o| mount_option(&mut a.options, o))
            },
        )
        .short('o')
        .doc(
            "ro, allow_other, allow_root, noreadahead, cache_size=BYTES, fsname=NAME, \
             subtype=TYPE, auto_unmount (refused to root), and the kernel's nodev/dev, nosuid/suid, noexec/exec, \
             noatime, sync, dirsync (nodev and nosuid by default); relatime, nodiratime, \
             strictatime, lazytime, rw, nofail, default_permissions... are accepted and ignored, \
             so that /etc/fstab lines written for other FUSE filesystems work.",
        ),
        Opt::<Self>::value(
            "digest",
            "DIGEST",
            "Mount the image SOURCE (written by verityfs publish) if its digest is DIGEST \
             (sha256:HEX, as publish prints it)",
            |a, v| {
                let digest = v.to_str().and_then(|t| t.parse().ok()).ok_or_else(|| {
                    Error::usage_msg(quote("invalid digest: '", &v, "' (expected sha256:HEX)"))
                })?;
                a.digest = Some(digest);
                Ok(())
            },
        )
        .doc(
            "The image is mounted read-only, nodev and nosuid; every file belongs to the \
             mounting user, with the modes, sizes and times of the image. Nothing is served \
             unless the image's manifest has this digest, and every byte read is verified.",
        ),
        Opt::<Self>::flag(
            "create",
            "Create the backing directory SOURCE if it does not exist",
            |a, _| {
                a.create = true;
                a.backing_only.get_or_insert("--create");
                Ok(())
            },
        )
        .doc("Without it, a missing SOURCE is an error; a missing MOUNTPOINT is always created."),
        Opt::<Self>::flag(
            "read-only",
            "Refuse every change to the backing directory (same as -o ro)",
            |a, _| {
                a.options.read_only = true;
                Ok(())
            },
        ),
        Opt::<Self>::flag(
            "no-merkle-readahead",
            "Read Merkle tree blocks one at a time, without readahead",
            |a, _| {
                a.options.read.merkle_readahead = false;
                Ok(())
            },
        ),
        Opt::<Self>::value(
            "cache-size",
            "BYTES",
            "Bytes of verified tree blocks to cache, with a K, M or G suffix (default 32M)",
            |a, v| {
                a.options.read.cache_bytes = parse_size(&v.to_string_lossy())?;
                Ok(())
            },
        ),
        Opt::<Self>::value(
            "threads",
            "N",
            "Threads reading FUSE requests, 1 to 64 (default 4); while all but one are busy, the last hands requests to extra workers",
            |a, v| match v.to_string_lossy().parse::<usize>() {
                Ok(n @ 1..=64) => {
                    a.options.threads = n;
                    Ok(())
                }
                _ => Err(Error::usage_msg(quote(
                    "invalid thread count: ",
                    &v,
                    " (1 to 64)",
                ))),
            },
        ),
        Opt::<Self>::value(
            "trusted-cert",
            "PEM",
            "Trust the PEM certificates in this file, or in the .pem/.crt files of this \
             directory, for built-in signatures",
            |a, v| {
                let certs = load_certificates(&v)?;
                a.trusted.extend(certs.iter().cloned());
                let signatures = std::mem::take(&mut a.options.signatures);
                a.options.signatures = signatures.trusting(certs);
                Ok(())
            },
        )
        .hint(Hint::Path)
        .doc(
            "May be given several times. For an image over HTTP or S3 without --digest: mount \
             it if its manifest is signed by one of them (as verityfs publish signs it).",
        ),
        Opt::<Self>::flag(
            "require-signatures",
            "Refuse to enable or open verity files without a valid built-in signature",
            |a, _| {
                let signatures = std::mem::take(&mut a.options.signatures);
                a.options.signatures = signatures.requiring();
                a.backing_only.get_or_insert("--require-signatures");
                Ok(())
            },
        ),
        Opt::<Self>::value(
            "timeout",
            "SECONDS",
            "For an image over HTTP or S3: the longest one request waits for the network, \
             retries included (default 30)",
            |a, v| match v.to_string_lossy().parse::<f64>() {
                Ok(secs) if (0.1..=3600.0).contains(&secs) => {
                    a.remote.timeout = Duration::from_secs_f64(secs);
                    a.remote_only.get_or_insert("--timeout");
                    Ok(())
                }
                _ => Err(Error::usage_msg(quote(
                    "invalid timeout: ",
                    &v,
                    " (0.1 to 3600 seconds)",
                ))),
            },
        )
        .doc(
            "Then the read fails with EIO (a read that needs data and tree blocks may wait for \
             each, and the kernel retries a failed read-ahead once); the mount goes on serving \
             other reads.",
        ),
        Opt::<Self>::value(
            "cache-dir",
            "DIR",
            "For an image over HTTP or S3: keep what is fetched in DIR (created if missing), \
             so that a second read, after a remount too, costs no network",
            |a, v| {
                a.disk_cache = Some(PathBuf::from(v));
                a.remote_only.get_or_insert("--cache-dir");
                Ok(())
            },
        )
        .hint(Hint::Dir)
        .doc(
            "Files are named by their contents' digest and shared by the images cached in DIR; \
             what is read from it is verified like what comes from the network (a block that \
             fails is fetched again), and it works offline for what it holds. DIR must belong \
             to the user who mounts and be writable by no one else.",
        ),
        Opt::<Self>::value(
            "cache-max",
            "BYTES",
            "The most the --cache-dir may take, with a K, M or G suffix (default 1G); the \
             least recently used files go first",
            |a, v| {
                a.cache_max = Some(parse_size(&v.to_string_lossy())? as u64);
                a.remote_only.get_or_insert("--cache-max");
                Ok(())
            },
        ),
    ];
    const OPERANDS: &'static [Operand] = &[
        Operand::one(
            "SOURCE",
            "The backing directory; with --digest, the image",
            Hint::Dir,
        ),
        Operand::one(
            "MOUNTPOINT",
            "Where to mount the verity view of SOURCE",
            Hint::Dir,
        ),
    ];

    fn run(mut self, _: &Command, operands: Vec<OsString>) -> Result<()> {
        let [source, mountpoint] = exactly(operands)?;
        let location = ImageLocation::parse(&source);
        let trust = match (self.digest.take(), &location) {
            (Some(_), _) if !self.trusted.is_empty() => {
                return Err(Error::usage_msg(
                    "an image is trusted by --digest or by --trusted-cert, not both",
                ))
            }
            (Some(digest), _) => ManifestTrust::Digest(digest),
            (None, ImageLocation::Dir(_)) => return self.mount_backing(source, mountpoint),
            (None, _) if !self.trusted.is_empty() => {
                ManifestTrust::Signed(std::mem::take(&mut self.trusted))
            }
            (None, _) => {
                return Err(Error::usage_msg(
                    "an image needs --digest (its trusted digest, as publish printed it) or \
                     --trusted-cert (the certificate its manifest is signed with)",
                ))
            }
        };
        self.mount_image(&location, &trust, mountpoint.into())
    }
}

impl MountArgs {
    fn mount_backing(self, backing: OsString, mountpoint: OsString) -> Result<()> {
        self.refuse_remote_only()?;
        if backing.is_empty() {
            // As `${BACKING}` expands in the systemd unit when the
            // configuration file does not set it.
            return Err(Error::usage_msg(
                "the backing directory is an empty string (is BACKING set?)",
            ));
        }
        let (backing, mountpoint) = (PathBuf::from(backing), PathBuf::from(mountpoint));
        let (backing_dir, dir) = prepare_directories(&backing, &mountpoint, self.create)?;
        verityfs_fuse::run(
            &backing,
            backing_dir,
            &dir,
            self.options,
            crate::notify::ready,
        )
        .map_err(|e| mount_error(&e, &dir))
    }

    /// How the image at `location` is read.
    fn store(&self, location: &ImageLocation, trust: &ManifestTrust) -> Result<Arc<dyn Store>> {
        let cache = match (&self.disk_cache, self.cache_max) {
            (Some(dir), max) => Some(DiskCacheArgs {
                dir: dir.clone(),
                max: max.unwrap_or(1 << 30),
            }),
            (None, Some(_)) => return Err(Error::usage_msg("--cache-max needs --cache-dir")),
            (None, None) => None,
        };
        // A manifest trusted by its signature has no name of its own in
        // the cache: it is fetched each time (its objects are cached).
        let manifest = match trust {
            ManifestTrust::Digest(digest) => Some(digest.to_string()),
            ManifestTrust::Signed(_) => None,
        };
        location.store(&self.remote, cache.as_ref(), manifest.as_deref())
    }

    /// A usage error if an option for remote images was given.
    fn refuse_remote_only(&self) -> Result<()> {
        match self.remote_only {
            Some(option) => Err(Error::usage_msg(format!(
                "{option} applies to images over HTTP or S3"
            ))),
            None => Ok(()),
        }
    }

    /// Checks the image at `location` against `digest`, then serves it.
    fn mount_image(
        self,
        location: &ImageLocation,
        trust: &ManifestTrust,
        mountpoint: PathBuf,
    ) -> Result<()> {
        if let Some(option) = self.backing_only {
            return Err(Error::usage_msg(format!(
                "{option} applies to backing directories, not to images"
            )));
        }
        if let ImageLocation::Dir(_) = location {
            self.refuse_remote_only()?;
        }
        let name = location.name();
        let fs = ImageFs::open(self.store(location, trust)?, trust, self.options.read)
            .map_err(|e| image_error(e, &name, trust))?;
        let dir = prepare_mountpoint(&mountpoint)?;
        tracing::info!("image verified: {} entries", fs.entries());
        let name = name.to_string_lossy();
        verityfs_fuse::run_image(fs, &name, &dir, self.options, crate::notify::ready)
            .map_err(|e| mount_error(&e, &dir))
    }
}

/// What a refused image named `name` says: why it cannot be read, or
/// that it is not the image `trust` names.
fn image_error(e: LibError, name: &OsStr, trust: &ManifestTrust) -> Error {
    let mismatch = match (trust, &e) {
        (
            ManifestTrust::Digest(_),
            LibError::Corrupted(_) | LibError::DescriptorTampered { .. },
        ) => "the image does not match --digest",
        (ManifestTrust::Signed(_), LibError::Signature(_) | LibError::NoSignature) => {
            "the image's manifest is not signed by a --trusted-cert"
        }
        _ => "the image is damaged",
    };
    match e {
        LibError::Io(e) => Error::io(quote("can't read the manifest of image '", name, "'"), &e),
        e => Error::msg(quote("image '", name, &format!("': {e}"))).context(mismatch),
    }
}

/// What a failed mount on `dir` says; it removes the mount point if it was
/// made for the mount (a refused mount leaves no trace: it may be inside
/// BACKING).
fn mount_error(e: &io::Error, dir: &OpenedDir) -> Error {
    if let Err(e) = dir.remove_if_made() {
        tracing::warn!("cannot remove the mount point made for the mount: {e}");
    }
    match crate::fuse_device::problem() {
        // Opening /dev/fuse was what failed.
        Some(device) => {
            let denied = io::Error::from_raw_os_error(libc::EACCES);
            let why = format!("': {}: {device}", crate::output::strerror(&denied));
            let path = dir.path().unwrap_or_default();
            Error::msg(quote("mounting '", path.as_os_str(), &why))
        }
        None => Error::msg(e.to_string()),
    }
}

/// BACKING must be a directory (created with `--create`: a typo must not
/// serve a new empty directory), reached without symbolic links that others
/// control (see `verityfs::safe_dir`): the daemon serves the directory it
/// opened, whatever happens to the path. A missing MOUNTPOINT is created, as
/// systemd does for its mounts. Returns both, opened.
fn prepare_directories(
    backing: &Path,
    mountpoint: &Path,
    create: bool,
) -> Result<(OpenedDir, OpenedDir)> {
    let backing_dir = open_dir_following(backing, create.then_some(0o755)).map_err(|e| {
        let error = match PathError::errno_of(&e) {
            Some(_) => Error::msg(format!("backing directory {e}")),
            None => Error::io(quote("backing directory '", backing.as_os_str(), "'"), &e),
        };
        match e.kind() {
            io::ErrorKind::NotFound if !create => error.context("use --create to create it"),
            _ => error,
        }
    })?;
    Ok((backing_dir, prepare_mountpoint(mountpoint)?))
}

/// Opens MOUNTPOINT, created if missing, without being redirected by
/// symbolic links that others control (see `verityfs::safe_dir`): the
/// mount is made on this directory, whatever happens to the path.
fn prepare_mountpoint(mountpoint: &Path) -> Result<OpenedDir> {
    open_dir(mountpoint, Some(0o755)).map_err(|e| match PathError::errno_of(&e) {
        Some(_) => Error::msg(format!("mount point {e}")),
        None => Error::io(quote("mount point '", mountpoint.as_os_str(), "'"), &e),
    })
}

/// The certificates of a PEM file, or of every `.pem`/`.crt` file of a
/// directory; a usage error if none can be read.
fn load_certificates(path: &OsStr) -> Result<Vec<Certificate>> {
    let path = Path::new(path);
    let files: Vec<PathBuf> = match std::fs::read_dir(path) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "pem" || x == "crt"))
            .collect(),
        Err(_) => vec![path.to_owned()],
    };
    let mut certs = Vec::new();
    for file in &files {
        let loaded = std::fs::read(file)
            .map_err(|e| e.to_string())
            .and_then(|pem| Certificate::all_from_pem(&pem).map_err(|e| e.to_string()));
        let more = loaded.map_err(|e| {
            let why = format!("': {e}");
            Error::usage_msg(quote(
                "can't load certificates from '",
                file.as_os_str(),
                &why,
            ))
        })?;
        certs.extend(more);
    }
    if certs.is_empty() {
        return Err(Error::usage_msg(quote(
            "no certificates in '",
            path.as_os_str(),
            "'",
        )));
    }
    Ok(certs)
}

/// One `-o` option.
fn mount_option(options: &mut MountOptions, option: &str) -> Result<()> {
    match option {
        "ro" => options.read_only = true,
        "allow_other" => options.allow_other = true,
        "noreadahead" => options.read.merkle_readahead = false,
        o if o.starts_with("cache_size=") => {
            options.read.cache_bytes = parse_size(&o["cache_size=".len()..])?
        }
        o if verityfs_fuse::accepts_mount_option(o) => options.mount_options.push(o.to_owned()),
        o if IGNORED.contains(&o) || o.starts_with("x-") || o.starts_with("comment=") => {}
        o => return Err(Error::usage_msg(format!("unknown mount option: {o}"))),
    }
    Ok(())
}

/// A byte count with an optional K, M or G suffix (powers of 1024).
fn parse_size(text: &str) -> Result<usize> {
    let (digits, shift) = match text.as_bytes().last() {
        Some(b'K' | b'k') => (&text[..text.len() - 1], 10),
        Some(b'M' | b'm') => (&text[..text.len() - 1], 20),
        Some(b'G' | b'g') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let size = digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift));
    size.ok_or_else(|| Error::usage_msg(format!("invalid size: {text}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64M").ok(), Some(64 << 20));
        assert_eq!(parse_size("4096").ok(), Some(4096));
        assert_eq!(parse_size("1g").ok(), Some(1 << 30));
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn mount_options() {
        let mut a = MountArgs::default();
        let options = &MountArgs::OPTIONS[0];
        assert_eq!(options.spec.short, Some('o'));
        (options.set)(&mut a, "ro,allow_other,nosuid,cache_size=1M".into()).unwrap();
        assert!(a.options.read_only && a.options.allow_other);
        assert_eq!(a.options.read.cache_bytes, 1 << 20);
        assert!((options.set)(&mut a, "bogus".into()).is_err());
    }
}
