//! `verityfs digest`: compute fs-verity digests of files, as
//! `fsverity digest` does (fsverity-utils `programs/cmd_digest.c`).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;

use verityfs::{build_merkle_tree, descriptor::formatted_digest, Descriptor, Error, TreeSink};

use crate::commands::{Command, EXIT_FAILURE, EXIT_OK};
use crate::getopt::{Getopt, LongOpt};
use crate::output::{error_msg, error_msg_errno, print_stdout, quote};
use crate::progress::bytes_bar;
use crate::tree_params::{TreeArgs, OPT_BLOCK_SIZE, OPT_HASH_ALG, OPT_SALT};

const OPT_OUT_MERKLE_TREE: u32 = 1;
const OPT_OUT_DESCRIPTOR: u32 = 2;
const OPT_COMPACT: u32 = 3;
const OPT_FOR_BUILTIN_SIG: u32 = 4;

const LONGOPTS: &[LongOpt] = &[
    LongOpt::required("hash-alg", OPT_HASH_ALG),
    LongOpt::required("block-size", OPT_BLOCK_SIZE),
    LongOpt::required("salt", OPT_SALT),
    LongOpt::required("out-merkle-tree", OPT_OUT_MERKLE_TREE),
    LongOpt::required("out-descriptor", OPT_OUT_DESCRIPTOR),
    LongOpt::flag("compact", OPT_COMPACT),
    LongOpt::flag("for-builtin-sig", OPT_FOR_BUILTIN_SIG),
];

/// Everything the options of `digest` ask for.
#[derive(Default)]
struct DigestArgs {
    tree: TreeArgs,
    out_tree: Option<OutFile>,
    out_descriptor: Option<OutFile>,
    compact: bool,
    for_builtin_sig: bool,
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
        let opened = File::options()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path);
        match opened {
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

/// Writes the tree into `--out-merkle-tree`: preallocated to the tree's
/// size, then each block at its position.
impl TreeSink for &OutFile {
    fn write_tree_block(&mut self, pos: u64, block: &[u8]) -> io::Result<()> {
        let result = self.file.write_all_at(block, pos);
        result.map_err(|e| self.failed(e, "error processing Merkle tree block"))
    }
}

/// Runs `verityfs digest`.
pub fn run(cmd: &Command, args: &[OsString]) -> u8 {
    let mut opts = DigestArgs::default();
    let mut getopt = Getopt::new(cmd.name, args, LONGOPTS);
    for opt in getopt.by_ref() {
        let ok = match opt {
            Ok((id, value)) => opts.take(id, value.unwrap_or_default()),
            Err(e) => {
                let _ = io::stderr().write_all(&[e.message(), b"\n"].concat());
                false
            }
        };
        if !ok {
            return cmd.usage_error();
        }
    }
    let files = getopt.into_operands();
    if files.is_empty() {
        return cmd.usage_error();
    }
    for name in &files {
        if let Err(()) = digest_one(&opts, name) {
            return EXIT_FAILURE;
        }
    }
    EXIT_OK
}

impl DigestArgs {
    fn take(&mut self, id: u32, value: OsString) -> bool {
        match id {
            OPT_OUT_MERKLE_TREE => OutFile::open(&mut self.out_tree, "--out-merkle-tree", &value),
            OPT_OUT_DESCRIPTOR => {
                OutFile::open(&mut self.out_descriptor, "--out-descriptor", &value)
            }
            OPT_COMPACT => {
                self.compact = true;
                true
            }
            OPT_FOR_BUILTIN_SIG => {
                self.for_builtin_sig = true;
                true
            }
            _ => self.tree.parse_option(id, &value),
        }
    }

    /// The line printed for `descriptor` of file `name`.
    fn output_line(&self, descriptor: &Descriptor, name: &OsStr) -> Vec<u8> {
        let alg = descriptor.params().hash_algorithm();
        let digest = descriptor.file_digest();
        let hex = if self.for_builtin_sig {
            verityfs::hash_algs::to_hex(&formatted_digest(alg, &digest))
        } else {
            digest.to_hex()
        };
        let mut line = match (self.compact, self.for_builtin_sig) {
            (true, _) => hex.into_bytes(),
            (false, true) => format!("{hex} ").into_bytes(),
            (false, false) => format!("{alg}:{hex} ").into_bytes(),
        };
        if !self.compact {
            line.extend_from_slice(name.as_bytes());
        }
        line.push(b'\n');
        line
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

/// Digests one file and prints its line; errors are printed here.
fn digest_one(opts: &DigestArgs, name: &OsStr) -> Result<(), ()> {
    let file = File::open(name)
        .map_err(|e| error_msg_errno(quote("can't open '", name, "' for reading"), &e))?;
    let size = file
        .metadata()
        .map_err(|e| error_msg_errno(quote("can't stat file '", name, "'"), &e))?
        .len();
    let descriptor = compute(opts, &file, name, size)
        .and_then(|d| write_descriptor(opts, &d).map(|()| d))
        .map_err(|e| {
            report_compute_error(&e, name);
            error_msg("failed to compute digest");
        })?;
    print_stdout(&opts.output_line(&descriptor, name));
    Ok(())
}

fn compute(opts: &DigestArgs, file: &File, name: &OsStr, size: u64) -> Result<Descriptor, Error> {
    let params = opts.tree.params()?;
    let data = DataFile { file, name };
    let bar = bytes_bar(size, &name.to_string_lossy());
    let mut progress = |done| {
        bar.set_position(done);
        Ok(())
    };
    let descriptor = match &opts.out_tree {
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

/// Appends the descriptor to `--out-descriptor`, if given.
fn write_descriptor(opts: &DigestArgs, descriptor: &Descriptor) -> Result<(), Error> {
    if let Some(out) = &opts.out_descriptor {
        let result = (&out.file).write_all(&descriptor.to_unsigned_bytes());
        result.map_err(|e| out.failed(e, "error processing fs-verity descriptor"))?;
    }
    Ok(())
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
