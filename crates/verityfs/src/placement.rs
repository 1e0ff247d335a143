//! Where a small verity file's blocks lie on the disk.
//!
//! A small verity file is read whole when opened (data, tree and
//! descriptor in one range), which costs one device request only if its
//! blocks lie next to each other. On ext4 they do not: the allocator maps a
//! file's logical blocks onto the disk at the same distances where it can,
//! so the 64 KiB-aligned tree lands either as far from the data as the gap
//! between them (when both are allocated together), or wherever free space
//! was when the enable's second `fsync` allocated it (after the first had
//! allocated the data alone); either way the two reads do not merge. Which
//! order the enable writes and syncs in does not change that, nor does
//! reserving the tree's blocks early (`fallocate`).
//!
//! [`place_together`] moves them: it writes a copy of the data and the
//! metadata one after the other into an unnamed scratch file, makes it
//! durable, and has ext4 swap the file's blocks for the copy's
//! (`EXT4_IOC_MOVE_EXT`, the online defragmenter's ioctl). The swap is
//! journaled and every block keeps its bytes whichever side of it a crash
//! falls on, so the file stays the same complete verity file throughout;
//! its data is copied, never changed.

use std::fs::File;
use std::io;
use std::num::NonZeroU64;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileExt, MetadataExt};

use rustix::fs::{Advice, Mode, OFlags};

use crate::error::Result;
use crate::open::WHOLE_FILE_PREFETCH_BYTES;
use crate::state::FileState;

/// `EXT4_IOC_MOVE_EXT`: `_IOWR('f', 15, struct move_extent)`.
const EXT4_IOC_MOVE_EXT: u32 = 0xC028_660F;

/// `struct move_extent` of `linux/ext4.h` (the kernel's
/// `fs/ext4/ext4.h`): swap `len` blocks of the file at `orig_start` with
/// those of the donor at `donor_start`.
#[repr(C)]
struct MoveExtent {
    reserved: u32,
    donor_fd: u32,
    orig_start: u64,
    donor_start: u64,
    len: u64,
    moved_len: u64,
}

/// Lays out the verity file `file` (open for reading and writing, not
/// written by anyone meanwhile) so that its data, Merkle tree and
/// descriptor are next to each other on the disk, if it is small enough to
/// be read whole at open (backing file up to 1 MiB) and lives on ext4; the
/// scratch copy is made in the directory `dir`, which must be on the same
/// filesystem and writable. Returns whether the blocks were moved: `false`
/// for a file this does not apply to (larger, not verity, or not on ext4,
/// or `dir` elsewhere).
///
/// Errors: those of the copy and of the ioctl (`EOPNOTSUPP` on ext4 with
/// `bigalloc` or `data=journal`, say); the file is a complete verity file
/// after any of them, as before the call. The data is copied, not changed,
/// and the file's times are kept.
pub fn place_together(file: &File, dir: impl AsFd) -> Result<bool> {
    let FileState::Verity(location) = FileState::read(file)? else {
        return Ok(false);
    };
    let end = location.desc_pos + u64::from(location.desc_size);
    let fs = rustix::fs::fstatfs(file).map_err(io::Error::from)?;
    if end > WHOLE_FILE_PREFETCH_BYTES || fs.f_type != libc::EXT4_SUPER_MAGIC as _ {
        return Ok(false);
    }
    let scratch = File::from(
        rustix::fs::openat(
            dir,
            ".",
            OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(io::Error::from)?,
    );
    if scratch.metadata()?.dev() != file.metadata()?.dev() {
        return Ok(false);
    }
    let block = fs.f_bsize as u64;
    // The kernel swaps whole pages: a block's offset within its page must
    // be the same in both files.
    let page = (rustix::param::page_size() as u64).max(block);
    let metadata_at = location.data_size.next_multiple_of(page);
    let mut buf = vec![0; location.data_size as usize];
    file.read_exact_at(&mut buf, 0)?;
    scratch.write_all_at(&buf, 0)?;
    buf.resize((end - location.tree_pos) as usize, 0);
    file.read_exact_at(&mut buf, location.tree_pos)?;
    scratch.write_all_at(&buf, metadata_at)?;
    // Durable before any swap: a crash after one then finds the same bytes
    // in the blocks the file gets.
    scratch.sync_all()?;
    // ext4 refuses (EBUSY) to swap blocks under the cached pages an enable
    // just wrote and synced, on some mounts even after forcing journal
    // commits; those pages are clean and can go (they are read again, from
    // the new blocks, when needed).
    let _ = rustix::fs::fadvise(file, 0, NonZeroU64::new(end), Advice::DontNeed);
    let blocks = |bytes: u64| bytes.div_ceil(block);
    move_extents(file, &scratch, 0, 0, blocks(location.data_size))?;
    move_extents(
        file,
        &scratch,
        location.tree_pos / block,
        metadata_at / block,
        blocks(end - location.tree_pos),
    )?;
    Ok(true)
}

/// Swaps `len` blocks of `file` from block `orig_start` with those of
/// `donor` from block `donor_start`.
#[allow(unsafe_code)]
fn move_extents(
    file: &File,
    donor: &File,
    orig_start: u64,
    donor_start: u64,
    len: u64,
) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let mut arg = MoveExtent {
        reserved: 0,
        donor_fd: donor.as_raw_fd() as u32,
        orig_start,
        donor_start,
        len,
        moved_len: 0,
    };
    // SAFETY: EXT4_IOC_MOVE_EXT reads and writes `arg`, a live `struct
    // move_extent` of the size its request number gives, and nothing else
    // of ours.
    let ret = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            EXT4_IOC_MOVE_EXT as libc::Ioctl,
            &mut arg as *mut MoveExtent,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
