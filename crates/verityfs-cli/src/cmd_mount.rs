//! `verityfs mount BACKING MOUNTPOINT`: serve a backing directory with
//! fs-verity semantics, in the foreground, until unmounted or interrupted.

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use verityfs::signature::Certificate;
use verityfs_fuse::MountOptions;

use crate::commands::{Command, EXIT_FAILURE, EXIT_OK};
use crate::getopt::{Getopt, LongOpt};
use crate::output::{error_msg, quote};

const OPT_OPTIONS: u32 = 1;
const OPT_READ_ONLY: u32 = 2;
const OPT_NO_READAHEAD: u32 = 3;
const OPT_CACHE_SIZE: u32 = 4;
const OPT_THREADS: u32 = 5;
const OPT_TRUSTED_CERT: u32 = 6;
const OPT_REQUIRE_SIGNATURES: u32 = 7;
const OPT_CREATE: u32 = 8;

/// The options of `mount`.
pub const LONGOPTS: &[LongOpt] = &[
    LongOpt::required("options", OPT_OPTIONS)
        .with_short(b'o')
        .with_help(
            "Comma-separated mount options: ro, allow_other, allow_root, noreadahead, \
             cache_size=BYTES, fsname=NAME, subtype=TYPE, auto_unmount, and the kernel's \
             nodev/dev, nosuid/suid, noexec/exec, noatime, sync, dirsync (nodev and nosuid \
             by default); relatime, nodiratime, strictatime, lazytime, rw, nofail, \
             default_permissions... are accepted and ignored",
        ),
    LongOpt::flag("create", OPT_CREATE).with_help(
        "Create BACKING if it does not exist (otherwise that is an error; a missing MOUNTPOINT \
         is always created)",
    ),
    LongOpt::flag("read-only", OPT_READ_ONLY)
        .with_help("Refuse every change to the backing directory (same as -o ro)"),
    LongOpt::flag("no-merkle-readahead", OPT_NO_READAHEAD)
        .with_help("Read Merkle tree blocks one at a time, without readahead"),
    LongOpt::required("cache-size", OPT_CACHE_SIZE)
        .with_help("Bytes of verified tree blocks to cache, with a K, M or G suffix (default 32M)"),
    LongOpt::required("threads", OPT_THREADS)
        .with_help("Threads serving FUSE requests, 1 to 64 (default 4)"),
    LongOpt::required("trusted-cert", OPT_TRUSTED_CERT).with_help(
        "Trust the PEM certificates in this file, or in the .pem/.crt files of this \
         directory, for built-in signatures (repeatable)",
    ),
    LongOpt::flag("require-signatures", OPT_REQUIRE_SIGNATURES)
        .with_help("Refuse to enable or open verity files without a valid built-in signature"),
];

/// Mount options (`-o`) accepted and ignored because they are the default
/// or are for mount(8) and /etc/fstab, so that fstab lines written for
/// other FUSE filesystems work (`x-*` and `comment=` too).
const IGNORED: &[&str] = &[
    "rw", "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group", "nofail",
    "_netdev",
];

/// Runs `verityfs mount`.
pub fn run(cmd: &Command, args: &[OsString]) -> u8 {
    let mut options = MountOptions::default();
    let mut create = false;
    let mut getopt = Getopt::new(cmd.name, args, LONGOPTS);
    for opt in getopt.by_ref() {
        let ok = match opt {
            Ok((OPT_CREATE, _)) => {
                create = true;
                true
            }
            Ok((id, value)) => take(&mut options, id, &value.unwrap_or_default()),
            Err(e) => {
                let _ = io::stderr().write_all(&[e.message(), b"\n"].concat());
                false
            }
        };
        if !ok {
            return cmd.usage_error();
        }
    }
    let Ok([backing, mountpoint]) = <[OsString; 2]>::try_from(getopt.into_operands()) else {
        return cmd.usage_error();
    };
    if backing.is_empty() {
        // As `${BACKING}` expands in the systemd unit when the
        // configuration file does not set it.
        error_msg("the backing directory is an empty string (is BACKING set?)");
        return cmd.usage_error();
    }
    let (backing, mountpoint) = (PathBuf::from(backing), PathBuf::from(mountpoint));
    let Some(made_mountpoint) = prepare_directories(&backing, &mountpoint, create) else {
        return EXIT_FAILURE;
    };
    crate::notify::ready_when_mounted(&mountpoint);
    match verityfs_fuse::run(&backing, &mountpoint, options) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            match crate::fuse_device::problem() {
                // Opening /dev/fuse was what failed.
                Some(device) => {
                    let denied = io::Error::from_raw_os_error(libc::EACCES);
                    let why = format!("': {}: {device}", crate::output::strerror(&denied));
                    error_msg(quote("mounting '", mountpoint.as_os_str(), &why))
                }
                None => error_msg(e.to_string()),
            }
            // A refused mount leaves no trace (it may be inside BACKING).
            if made_mountpoint {
                let _ = std::fs::remove_dir(&mountpoint);
            }
            EXIT_FAILURE
        }
    }
}

/// BACKING must be a directory (created with `--create`: a typo must not
/// serve a new empty directory). A missing MOUNTPOINT is created, as
/// systemd does for its mounts. Returns whether it was, or `None` after
/// saying why it cannot go on.
fn prepare_directories(backing: &Path, mountpoint: &Path, create: bool) -> Option<bool> {
    let what = quote("backing directory '", backing.as_os_str(), "'");
    match std::fs::metadata(backing) {
        Ok(m) if !m.is_dir() => {
            let e = io::Error::from_raw_os_error(libc::ENOTDIR);
            crate::output::error_msg_errno(what, &e);
            return None;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound && !create => {
            crate::output::error_msg_errno(what, &e);
            error_msg("use --create to create it");
            return None;
        }
        _ => {}
    }
    let made_mountpoint = matches!(mountpoint.try_exists(), Ok(false));
    for dir in [backing, mountpoint] {
        if let Err(e) = std::fs::create_dir_all(dir) {
            crate::output::error_msg_errno(
                quote("can't create directory '", dir.as_os_str(), "'"),
                &e,
            );
            return None;
        }
    }
    Some(made_mountpoint)
}

fn take(options: &mut MountOptions, id: u32, value: &OsStr) -> bool {
    let text = value.to_string_lossy();
    match id {
        OPT_OPTIONS => text
            .split(',')
            .filter(|o| !o.is_empty())
            .all(|o| mount_option(options, o)),
        OPT_READ_ONLY => {
            options.read_only = true;
            true
        }
        OPT_NO_READAHEAD => {
            options.read.merkle_readahead = false;
            true
        }
        OPT_CACHE_SIZE => parse_size(&text)
            .map(|n| options.read.cache_bytes = n)
            .is_some(),
        OPT_THREADS => match text.parse::<usize>() {
            Ok(n @ 1..=64) => {
                options.threads = n;
                true
            }
            _ => {
                error_msg(format!("invalid thread count: {text} (1 to 64)"));
                false
            }
        },
        OPT_TRUSTED_CERT => match load_certificates(value) {
            Some(certs) => {
                options.signatures = std::mem::take(&mut options.signatures).trusting(certs);
                true
            }
            None => false,
        },
        OPT_REQUIRE_SIGNATURES => {
            options.signatures = std::mem::take(&mut options.signatures).requiring();
            true
        }
        _ => unreachable!("unknown option id {id}"),
    }
}

/// The certificates of a PEM file, or of every `.pem`/`.crt` file of a
/// directory; `None` (after saying why) if none can be read.
fn load_certificates(path: &OsStr) -> Option<Vec<Certificate>> {
    let path = std::path::Path::new(path);
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
        match loaded {
            Ok(more) => certs.extend(more),
            Err(e) => {
                error_msg(quote(
                    "can't load certificates from '",
                    file.as_os_str(),
                    &format!("': {e}"),
                ));
                return None;
            }
        }
    }
    if certs.is_empty() {
        error_msg(quote("no certificates in '", path.as_os_str(), "'"));
        return None;
    }
    Some(certs)
}

/// One `-o` option.
fn mount_option(options: &mut MountOptions, option: &str) -> bool {
    match option {
        "ro" => options.read_only = true,
        "allow_other" => options.allow_other = true,
        "noreadahead" => options.read.merkle_readahead = false,
        o if o.starts_with("cache_size=") => match parse_size(&o["cache_size=".len()..]) {
            Some(n) => options.read.cache_bytes = n,
            None => return false,
        },
        o if verityfs_fuse::accepts_mount_option(o) => options.mount_options.push(o.to_owned()),
        o if IGNORED.contains(&o) || o.starts_with("x-") || o.starts_with("comment=") => {}
        o => {
            error_msg(format!("unknown mount option: {o}"));
            return false;
        }
    }
    true
}

/// A byte count with an optional K, M or G suffix (powers of 1024).
fn parse_size(text: &str) -> Option<usize> {
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
    if size.is_none() {
        error_msg(format!("invalid size: {text}"));
    }
    size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64M"), Some(64 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size("x"), None);
    }

    #[test]
    fn mount_options() {
        let mut o = MountOptions::default();
        assert!(take(
            &mut o,
            OPT_OPTIONS,
            OsStr::new("ro,allow_other,nosuid,cache_size=1M")
        ));
        assert!(o.read_only && o.allow_other);
        assert_eq!(o.read.cache_bytes, 1 << 20);
        assert!(!take(&mut o, OPT_OPTIONS, OsStr::new("bogus")));
    }
}
