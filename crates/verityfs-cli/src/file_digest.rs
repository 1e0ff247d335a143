//! What `digest` and `sign` share: the tree options with
//! `--out-merkle-tree` and `--out-descriptor` (fsverity-utils'
//! `parse_tree_param()`), and computing one file's descriptor with
//! libfsverity's error messages (`libfsverity_compute_digest()` and its
//! metadata callbacks).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};

use verityfs::{build_merkle_tree, Descriptor, Error as LibError, TreeSink};

use crate::error::{Context, Error, Result};
use crate::opts::{Hint, Opt};
use crate::output::{open_for_reading, quote};
use crate::progress::bytes_bar;
use crate::tree_params::{once, HasTree, TreeArgs};

/// The arguments of a command that computes a digest.
pub trait HasDigest {
    /// Where the digest options go.
    fn digest(&mut self) -> &mut DigestOptions;
}

impl<A: HasDigest> HasTree for A {
    fn tree(&mut self) -> &mut TreeArgs {
        &mut self.digest().tree
    }
}

/// `--out-merkle-tree`, which starts a line of the usage texts.
pub const fn out_merkle_tree<A: HasDigest>() -> Opt<A> {
    Opt::<A>::value(
        "out-merkle-tree",
        "FILE",
        "Write the Merkle tree to FILE, as FS_IOC_READ_VERITY_METADATA gives it",
        |a, v| OutFile::open(&mut a.digest().out_tree, "--out-merkle-tree", &v),
    )
    .hint(Hint::File)
    .new_line()
}

/// `--out-descriptor`.
pub const fn out_descriptor<A: HasDigest>() -> Opt<A> {
    Opt::<A>::value(
        "out-descriptor",
        "FILE",
        "Write the fs-verity descriptor (256 bytes) to FILE",
        |a, v| OutFile::open(&mut a.digest().out_descriptor, "--out-descriptor", &v),
    )
    .hint(Hint::File)
}

/// The tree parameters and metadata output files of a digest computation.
#[derive(Default)]
pub struct DigestOptions {
    /// `--hash-alg`, `--block-size`, `--salt`.
    pub tree: TreeArgs,
    out_tree: Option<OutFile>,
    out_descriptor: Option<OutFile>,
}

impl DigestOptions {
    /// Computes the descriptor of file `name`, writing the tree and the
    /// descriptor to the output files if asked. Errors end with `failed to
    /// compute digest` where libfsverity failed.
    pub fn compute(&self, name: &OsStr) -> Result<Descriptor> {
        let file = open_for_reading(name)?;
        let size = file
            .metadata()
            .map_err(|e| Error::io(quote("can't stat file '", name, "'"), &e))?
            .len();
        self.build(&file, name, size)
            .and_then(|d| self.write_descriptor(&d).map(|()| d))
            .map_err(|e| compute_error(&e, name))
            .context("failed to compute digest")
    }

    fn build(&self, file: &File, name: &OsStr, size: u64) -> Result<Descriptor, LibError> {
        let params = self.tree.params()?;
        let data = DataFile { file, name };
        let bar = bytes_bar(size, &name.to_string_lossy());
        let mut progress = |done| {
            bar.set_position(done);
            Ok(())
        };
        let descriptor = match &self.out_tree {
            Some(out) => {
                let tree_size = verityfs::TreeGeometry::new(&params, size).tree_size();
                preallocate(out, tree_size)?;
                build_merkle_tree(&params, size, data, out, &mut progress)?.0
            }
            None => build_merkle_tree(&params, size, data, verityfs::DiscardTree, &mut progress)?.0,
        };
        bar.finish_and_clear();
        Ok(descriptor)
    }

    /// Appends the descriptor to `--out-descriptor`, if given.
    fn write_descriptor(&self, descriptor: &Descriptor) -> Result<(), LibError> {
        if let Some(out) = &self.out_descriptor {
            let result = (&out.file).write_all(&descriptor.to_unsigned_bytes());
            result.map_err(|e| out.failed(&e, "error processing fs-verity descriptor"))?;
        }
        Ok(())
    }
}

/// An output file opened while parsing options, as fsverity does.
struct OutFile {
    file: File,
    name: OsString,
}

impl OutFile {
    fn open(slot: &mut Option<OutFile>, opt_name: &str, path: &OsStr) -> Result<()> {
        once(slot, opt_name)?;
        let file = create_output(path).map_err(|e| {
            Error::io(quote("can't open '", path, "' for writing"), &e).into_usage()
        })?;
        let name = path.to_owned();
        *slot = Some(OutFile { file, name });
        Ok(())
    }

    /// A failed write to this file as fsverity reports it: what failed,
    /// then what libfsverity was doing.
    fn failed(&self, e: &io::Error, doing: &str) -> io::Error {
        Error::io(quote("writing to '", &self.name, "'"), e)
            .context(doing)
            .into_io(e.kind())
    }
}

/// Creates (or truncates) an output file as fsverity's `open_file()` does:
/// `O_WRONLY|O_CREAT|O_TRUNC`, mode 0644.
pub fn create_output(path: &OsStr) -> io::Result<File> {
    File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(path)
}

/// Writes the tree into `--out-merkle-tree`: preallocated to the tree's
/// size, then each block at its position.
impl TreeSink for &OutFile {
    fn write_tree_block(&mut self, pos: u64, block: &[u8]) -> io::Result<()> {
        let result = self.file.write_all_at(block, pos);
        result.map_err(|e| self.failed(&e, "error processing Merkle tree block"))
    }
}

/// The data file, reporting read errors as fsverity's `full_read()` does.
struct DataFile<'a> {
    file: &'a File,
    name: &'a OsStr,
}

impl Read for DataFile<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.file.read(buf).map_err(|e| {
            Error::io(quote("reading from '", self.name, "'"), &e)
                .context("error reading file")
                .into_io(e.kind())
        })
    }
}

/// Grows the tree file to `size` bytes, never shrinking it, as
/// `posix_fallocate()` does (which also fails on devices and pipes).
/// Failures are reported as fsverity reports them: `posix_fallocate()`
/// does not set `errno`, so there is no reason after the file name.
fn preallocate(out: &OutFile, size: u64) -> io::Result<()> {
    if size == 0 {
        return Ok(());
    }
    let result = out.file.metadata().and_then(|m| match m.is_file() {
        true if size > m.len() => out.file.set_len(size),
        true => Ok(()),
        false => Err(io::ErrorKind::Unsupported.into()),
    });
    result.map_err(|e| {
        let what = format!("preallocating {size}-byte file '");
        Error::msg(quote(&what, &out.name, "'"))
            .context("error processing Merkle tree size")
            .into_io(e.kind())
    })
}

/// What libfsverity would print for `e` before "failed to compute
/// digest".
fn compute_error(e: &LibError, name: &OsStr) -> Error {
    match e {
        LibError::Io(io) => Error::carried(io).unwrap_or_else(Error::reported),
        LibError::UnexpectedEof { .. } => {
            Error::msg(quote("unexpected end-of-file on '", name, "'"))
                .context("error reading file")
        }
        other => Error::msg(other.to_string()),
    }
}
