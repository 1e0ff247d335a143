//! A FUSE filesystem that gives fs-verity semantics to any directory: the
//! unmodified `fsverity enable` and `fsverity measure` work through it,
//! verity files are read-only, and every read of one is verified against
//! its Merkle tree (by the [`verityfs`] library).
//!
//! The kernel applies none of fs-verity's rules to FUSE files, so the
//! daemon applies all of them itself: the checks and errnos of
//! `FS_IOC_ENABLE_VERITY` in the kernel's order, `EPERM` for opening a
//! verity file for writing or truncating it, `ETXTBSY` for writers during
//! an enable, and `EIO` for any read that does not verify.
//!
//! It has no `unsafe` code: its system calls go through the safe wrappers
//! of `rustix`, `fuser` and `signal-hook`.

#![forbid(unsafe_code)]

mod attr;
mod caller;
mod creds;
mod descriptors;
mod dir_ops;
mod direct_mount;
mod file_ops;
mod filesystem;
mod fs;
mod handles;
mod image_fs;
mod inodes;
mod invalidate;
// Public for the fuzz targets in `fuzz/` (the ioctl payload decoders)
// only; not an API.
#[doc(hidden)]
pub mod ioctl;
mod mount;
mod mount_point;
// The mount table, shared with the CLI.
use verityfs::mountinfo;
mod placement;
mod policy;
mod readers;
mod space_ops;
mod spare;
mod verity_ops;
mod xattr_ops;

pub use fs::MountOptions;
pub use image_fs::ImageFs;
pub use mount::{accepts_mount_option, run, run_image, BackgroundMount};
pub use policy::SignaturePolicy;
pub use xattr_ops::{BACKING_XATTR, STATS_XATTR};
