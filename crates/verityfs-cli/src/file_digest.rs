//! What `digest` and `sign` share: the tree options with
//! `--out-merkle-tree` and `--out-descriptor` (fsverity-utils'
//! `parse_tree_param()`), and computing one file's descriptor with
//! libfsverity's error messages (`libfsverity_compute_digest()` and its
//! metadata callbacks).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};

use verityfs::{build_merkle_tree, Descriptor, Error, TreeSink};

use crate::getopt::LongOpt;
use crate::output::{error_msg, error_msg_errno, open_for_reading, quote};
use crate::progress::bytes_bar;
use crate::tree_params::{self, TreeArgs};

/// `--out-merkle-tree`.
const OPT_OUT_MERKLE_TREE: u32 = 110;
/// `--out-descriptor`.
const OPT_OUT_DESCRIPTOR: u32 = 111;

/// The options of a command: `before`, then those [`DigestOptions`] takes
/// (the tree options, `--out-merkle-tree`, `--out-descriptor`), then
/// `after`, as fsverity's tables order them.
pub fn longopts(before: &[LongOpt], after: &[LongOpt]) -> Vec<LongOpt> {
    let out_files = [
        LongOpt::required("out-merkle-tree", OPT_OUT_MERKLE_TREE)
            .with_help("Write the Merkle tree to FILE, as FS_IOC_READ_VERITY_METADATA gives it"),
        LongOpt::required("out-descriptor", OPT_OUT_DESCRIPTOR)
            .with_help("Write the fs-verity descriptor (256 bytes) to FILE"),
    ];
    [before, &tree_params::LONGOPTS, &out_files, after].concat()
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
    /// Takes one of the options of [`longopts`], opening output files at once
    /// as fsverity does; prints fsverity's message and returns false when
    /// the value is bad or the option was already given.
    pub fn parse_option(&mut self, id: u32, value: &OsStr) -> bool {
        match id {
            OPT_OUT_MERKLE_TREE => OutFile::open(&mut self.out_tree, "--out-merkle-tree", value),
            OPT_OUT_DESCRIPTOR => {
                OutFile::open(&mut self.out_descriptor, "--out-descriptor", value)
            }
            _ => self.tree.parse_option(id, value),
        }
    }

    /// Computes the descriptor of file `name`, writing the tree and the
    /// descriptor to the output files if asked. Errors are printed here,
    /// ending with `failed to compute digest` where libfsverity failed.
    pub fn compute(&self, name: &OsStr) -> Result<Descriptor, ()> {
        let file = open_for_reading(name).ok_or(())?;
        let size = file
            .metadata()
            .map_err(|e| error_msg_errno(quote("can't stat file '", name, "'"), &e))?
            .len();
        self.build(&file, name, size)
            .and_then(|d| self.write_descriptor(&d).map(|()| d))
            .map_err(|e| {
                report_compute_error(&e, name);
                error_msg("failed to compute digest");
            })
    }

    fn build(&self, file: &File, name: &OsStr, size: u64) -> Result<Descriptor, Error> {
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
    fn write_descriptor(&self, descriptor: &Descriptor) -> Result<(), Error> {
        if let Some(out) = &self.out_descriptor {
            let result = (&out.file).write_all(&descriptor.to_unsigned_bytes());
            result.map_err(|e| out.failed(e, "error processing fs-verity descriptor"))?;
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
    fn open(slot: &mut Option<OutFile>, opt_name: &str, path: &OsStr) -> bool {
        if slot.is_some() {
            error_msg(format!("{opt_name} can only be specified once"));
            return false;
        }
        match create_output(path) {
            Ok(file) => {
                *slot = Some(OutFile {
                    file,
                    name: path.to_owned(),
                })
            }
            Err(e) => error_msg_errno(quote("can't open '", path, "' for writing"), &e),
        }
        slot.is_some()
    }

    /// Reports a failed write to this file as fsverity does: what failed,
    /// then what libfsverity was doing.
    fn failed(&self, e: io::Error, doing: &str) -> io::Error {
        error_msg_errno(quote("writing to '", &self.name, "'"), &e);
        error_msg(doing);
        e
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
        result.map_err(|e| self.failed(e, "error processing Merkle tree block"))
    }
}

/// Marks a read error as already reported, so it is told apart from tree
/// output errors.
#[derive(Debug)]
struct ReadFailed;

impl std::fmt::Display for ReadFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("error reading file")
    }
}

impl std::error::Error for ReadFailed {}

/// The data file, reporting read errors as fsverity's `full_read()` does.
struct DataFile<'a> {
    file: &'a File,
    name: &'a OsStr,
}

impl Read for DataFile<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.file.read(buf).map_err(|e| {
            error_msg_errno(quote("reading from '", self.name, "'"), &e);
            io::Error::new(e.kind(), ReadFailed)
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
    result.inspect_err(|_| {
        let what = format!("preallocating {size}-byte file '");
        error_msg(quote(&what, &out.name, "'"));
        error_msg("error processing Merkle tree size");
    })
}

/// Prints what libfsverity would print for `e` before "failed to compute
/// digest".
fn report_compute_error(e: &Error, name: &OsStr) {
    match e {
        Error::Io(io) if io.get_ref().is_some_and(|r| r.is::<ReadFailed>()) => {
            error_msg("error reading file");
        }
        Error::UnexpectedEof { .. } => {
            error_msg(quote("unexpected end-of-file on '", name, "'"));
            error_msg("error reading file");
        }
        // Output errors were reported where they happened.
        Error::Io(_) => {}
        other => error_msg(other.to_string()),
    }
}
