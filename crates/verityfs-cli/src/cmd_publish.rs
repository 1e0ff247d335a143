//! `verityfs publish SRC_DIR DEST_DIR`: publish a directory tree as an
//! image (`docs/IMAGE.md`) and print the one digest readers must trust.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::Path;

use verityfs::image::publish;
use verityfs::Error as LibError;

use crate::commands::Command;
use crate::error::{Error, Result};
use crate::opts::{exactly, Args, Hint, Operand, Opt};
use crate::output::{print_stdout, quote};
use crate::tree_params::{block_size, hash_alg, salt, HasTree, TreeArgs};

/// Everything the options of `publish` ask for.
#[derive(Default)]
pub struct PublishArgs {
    tree: TreeArgs,
}

impl HasTree for PublishArgs {
    fn tree(&mut self) -> &mut TreeArgs {
        &mut self.tree
    }
}

impl Args for PublishArgs {
    const OPTIONS: &'static [Opt<Self>] = &[hash_alg(), block_size(), salt()];
    const OPERANDS: &'static [Operand] = &[
        Operand::one("SRC_DIR", "The directory tree to publish", Hint::Dir),
        Operand::one(
            "DEST_DIR",
            "Where to write the image (created if missing)",
            Hint::Dir,
        ),
    ];

    fn run(self, _: &Command, operands: Vec<OsString>) -> Result<()> {
        let [src, dest] = exactly(operands)?;
        let params = self.tree.params().map_err(|e| Error::msg(e.to_string()))?;
        let published = publish(Path::new(&src), Path::new(&dest), &params)
            .map_err(|e| publish_error(e, &src))?;
        for path in &published.skipped {
            warn_skipped(path);
        }
        let digest = format!("{}:{}\n", published.algorithm, published.digest);
        print_stdout(digest.as_bytes());
        Ok(())
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
