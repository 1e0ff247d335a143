//! `verityfs verify`: scrub verity files. Every regular file under the
//! given paths that is a verity file has every data block checked against
//! its Merkle tree ([`verityfs::check::check_file`]). Paths may be backing
//! files or paths through a `verityfs mount`: either way the stored file is
//! checked (see [`crate::locate`]).
//!
//! Output (stdout): one kernel-style `FILE CORRUPTED!` line per bad block,
//! then `<path>: OK (N blocks)` or `<path>: N corrupted blocks` per file,
//! and finally `verified N files, M corrupted, K not verity`; with
//! `--json`, one JSON document instead. A file that carries a location
//! record but cannot be opened as a verity file (bad record or descriptor,
//! metadata cut off), and an ordinary file ending with verity metadata (a
//! backing file copied without its extended attributes), are `ERROR:`s,
//! and count as verified and corrupted. Ordinary files found in
//! directories are counted as not verity; a regular file named on the
//! command line that is not verity, and a directory holding no verity
//! file, are errors, and so is anything named that is neither a regular
//! file nor a directory. Symbolic links named on the command line are
//! followed, those found in directories are not (as `find -H`).
//!
//! `--check=LIST` checks the files of a list of expected digests in the
//! format `fsverity digest` prints (`sha256:HEX FILE` lines, see
//! [`crate::digest_list`]); `--tree` and `--descriptor` check data against
//! a separate Merkle tree and descriptor; `--digest` requires the digest.
//! Exit status 1 if anything was corrupted, not as expected, or failed.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use verityfs::{Corruption, ExpectedDigest, ReadOptions, Verifier};

use crate::commands::Command;
use crate::error::{Error, Result};
use crate::opts::{Args, Arity, Hint, Operand, Opt};
use crate::output::{error_msg, error_msg_errno, print_stdout, quote};
use crate::scrub::{check_detached, check_path, FileReport, Outcome};

/// What the options asked for.
#[derive(Default)]
pub struct VerifyArgs {
    json: bool,
    list: Option<OsString>,
    digest: Option<ExpectedDigest>,
    tree: Option<PathBuf>,
    descriptor: Option<PathBuf>,
}

impl Args for VerifyArgs {
    const OPTIONS: &'static [Opt<Self>] = &[
        Opt::<Self>::flag(
            "json",
            "Print one JSON document: every file's result, digest and bad blocks",
            |a, _| {
                a.json = true;
                Ok(())
            },
        ),
        Opt::<Self>::value(
            "check",
            "LIST",
            "Check the files listed in LIST (- for stdin) against their digests",
            |a, v| {
                a.list = Some(v);
                Ok(())
            },
        )
        .short('c')
        .hint(Hint::File)
        .doc("One 'sha256:HEX FILE' line each, as fsverity digest and measure print them."),
        Opt::<Self>::value(
            "digest",
            "DIGEST",
            "Require this digest (sha256:HEX or HEX) of the single FILE",
            |a, v| match v.to_str().map(str::parse::<ExpectedDigest>) {
                Some(Ok(digest)) => {
                    a.digest = Some(digest);
                    Ok(())
                }
                _ => Err(Error::usage_msg(quote("invalid digest: '", &v, "'"))),
            },
        ),
        Opt::<Self>::value(
            "tree",
            "TREE_FILE",
            "Check FILE against this separate Merkle tree (needs --descriptor)",
            |a, v| {
                a.tree = Some(v.into());
                Ok(())
            },
        )
        .hint(Hint::File),
        Opt::<Self>::value(
            "descriptor",
            "DESCRIPTOR_FILE",
            "Check FILE against this separate descriptor (needs --tree)",
            |a, v| {
                a.descriptor = Some(v.into());
                Ok(())
            },
        )
        .hint(Hint::File),
    ];
    const OPERANDS: &'static [Operand] = &[Operand::one(
        "PATH",
        "A verity backing file, or a directory to scan recursively",
        Hint::Path,
    )
    .times(Arity::Any)];

    fn run(self, _: &Command, operands: Vec<OsString>) -> Result<()> {
        let Some(mode) = self.mode(&operands) else {
            return Err(match self.tree.is_some() != self.descriptor.is_some() {
                true => Error::usage_msg("--tree and --descriptor go together"),
                false => Error::usage(),
            });
        };
        let mut scrub = Scrub::new(self.json);
        let expected = self.digest.as_ref();
        match mode {
            Mode::List(list) => scrub.check_list(list),
            Mode::Detached {
                data,
                tree,
                descriptor,
            } => scrub.detached(data, tree, descriptor, expected),
            Mode::Paths(paths) => {
                for path in paths {
                    scrub.operand(Path::new(path), expected);
                }
            }
        }
        scrub.finish()
    }
}

/// What `verify` was asked to check.
enum Mode<'a> {
    /// The files of a digest list.
    List(&'a OsStr),
    /// Data against a separate tree and descriptor.
    Detached {
        data: &'a Path,
        tree: &'a Path,
        descriptor: &'a Path,
    },
    /// Files and directories (one file with `--digest`).
    Paths(&'a [OsString]),
}

impl VerifyArgs {
    /// The mode the options and operands ask for; `None` for a combination
    /// that makes no sense (a usage error).
    fn mode<'a>(&'a self, operands: &'a [OsString]) -> Option<Mode<'a>> {
        let one_digest = self.digest.is_none() || operands.len() == 1;
        match (&self.list, &self.tree, &self.descriptor, operands) {
            (Some(list), None, None, []) if self.digest.is_none() => Some(Mode::List(list)),
            (None, Some(tree), Some(descriptor), [data]) => Some(Mode::Detached {
                data: Path::new(data),
                tree,
                descriptor,
            }),
            (None, None, None, [_, ..]) if one_digest => Some(Mode::Paths(operands)),
            _ => None,
        }
    }
}

/// The walk, its counts and the reports kept for `--json`.
struct Scrub {
    verifier: Arc<Verifier>,
    /// Verity files checked (or found broken).
    verified: u64,
    /// Verity files with bad blocks, broken metadata, another digest than
    /// expected, or read errors.
    corrupted: u64,
    /// Regular files that are not verity files.
    not_verity: u64,
    /// A path could not be examined, or was not what it had to be.
    failed: bool,
    /// `Some` with `--json`: the report of every file, in order.
    json: Option<Vec<serde_json::Value>>,
}

impl Scrub {
    fn new(json: bool) -> Self {
        Scrub {
            verifier: Verifier::new(ReadOptions::default()),
            verified: 0,
            corrupted: 0,
            not_verity: 0,
            failed: false,
            json: json.then(Vec::new),
        }
    }

    /// Checks a path named on the command line (or in a list): a regular
    /// file must be verity (or have the `expected` digest), a directory
    /// must hold at least one verity file.
    fn operand(&mut self, path: &Path, expected: Option<&ExpectedDigest>) {
        let before = self.verified;
        match fs::metadata(path) {
            Ok(m) if m.is_dir() && expected.is_none() => {
                self.visit_dir(path);
                if self.verified == before {
                    self.fail_msg(quote("no verity files under '", path.as_os_str(), "'"));
                }
            }
            Ok(m) if m.is_file() => {
                if let Outcome::NotVerity = self.check(path, expected) {
                    self.fail_msg(quote("'", path.as_os_str(), "' is not a verity file"));
                }
            }
            Ok(_) if expected.is_some() => {
                self.fail_msg(quote("'", path.as_os_str(), "' is not a regular file"));
            }
            Ok(_) => self.visit(path, true),
            Err(e) => self.fail(quote("can't stat '", path.as_os_str(), "'"), &e),
        }
    }

    /// Checks `path`: a regular file, or everything under a directory.
    fn visit(&mut self, path: &Path, follow_symlink: bool) {
        let metadata = if follow_symlink {
            fs::metadata(path)
        } else {
            fs::symlink_metadata(path)
        };
        match metadata {
            Ok(m) if m.is_dir() => self.visit_dir(path),
            Ok(m) if m.is_file() => {
                self.check(path, None);
            }
            // Named on the command line: checking nothing is no success.
            Ok(_) if follow_symlink => {
                self.failed = true;
                let what = "' is not a regular file or directory";
                error_msg(quote("'", path.as_os_str(), what));
            }
            Ok(_) => {}
            Err(e) => self.fail(quote("can't stat '", path.as_os_str(), "'"), &e),
        }
    }

    /// Visits the entries of `dir` in name order.
    fn visit_dir(&mut self, dir: &Path) {
        let entries: io::Result<Vec<PathBuf>> =
            fs::read_dir(dir).and_then(|it| it.map(|entry| entry.map(|e| e.path())).collect());
        match entries {
            Ok(mut paths) => {
                paths.sort();
                for path in paths {
                    self.visit(&path, false);
                }
            }
            Err(e) => self.fail(quote("can't read directory '", dir.as_os_str(), "'"), &e),
        }
    }

    /// Checks the entries of the digest list `list` (`-`: stdin).
    fn check_list(&mut self, list: &OsStr) {
        let text = match list.as_encoded_bytes() {
            b"-" => {
                let mut text = Vec::new();
                io::stdin().read_to_end(&mut text).map(|_| text)
            }
            _ => fs::read(list),
        };
        let text = match text {
            Ok(text) => text,
            Err(e) => return self.fail(quote("can't read '", list, "'"), &e),
        };
        let (entries, malformed) = crate::digest_list::parse(&text);
        for line in malformed {
            self.fail_msg(quote(
                "",
                list,
                &format!(":{line}: not a 'DIGEST FILE' line"),
            ));
        }
        if entries.is_empty() {
            self.fail_msg(quote("no digests in '", list, "'"));
        }
        for entry in entries {
            self.operand(&entry.path, Some(&entry.expected));
        }
    }

    /// Checks `data` against a separate tree and descriptor.
    fn detached(
        &mut self,
        data: &Path,
        tree: &Path,
        descriptor: &Path,
        expected: Option<&ExpectedDigest>,
    ) {
        let json = self.json.is_some();
        let report = check_detached(&self.verifier, data, tree, descriptor, expected, &mut |c| {
            print_corruption(json, c)
        });
        self.record(data, report);
    }

    /// Checks one regular file and records the result; returns the outcome.
    fn check(&mut self, path: &Path, expected: Option<&ExpectedDigest>) -> Outcome {
        let json = self.json.is_some();
        let report = check_path(&self.verifier, path, expected, &mut |c| {
            print_corruption(json, c)
        });
        self.record(path, report)
    }

    /// Counts a report and prints (or keeps) it; returns its outcome.
    fn record(&mut self, path: &Path, report: FileReport) -> Outcome {
        let name = path.as_os_str();
        match &report.outcome {
            Outcome::NotVerity => self.not_verity += 1,
            Outcome::Ok { .. } | Outcome::OkThroughMount { .. } => self.verified += 1,
            Outcome::Failed(_) if report.digest.is_none() => self.failed = true,
            _ => {
                self.verified += 1;
                self.corrupted += 1;
            }
        }
        match &mut self.json {
            Some(reports) => reports.push(json_report(path, &report)),
            None => print_text(name, &report),
        }
        report.outcome
    }

    fn fail(&mut self, what: Vec<u8>, e: &io::Error) {
        self.failed = true;
        error_msg_errno(what, e);
    }

    fn fail_msg(&mut self, what: Vec<u8>) {
        self.failed = true;
        error_msg(what);
    }

    /// Prints the summary (or the JSON document); fails if anything was
    /// corrupted or failed (as said on the way).
    fn finish(self) -> Result<()> {
        let ok = self.corrupted == 0 && !self.failed;
        match self.json {
            Some(files) => {
                let doc = serde_json::json!({
                    "files": files,
                    "verified": self.verified,
                    "corrupted": self.corrupted,
                    "not_verity": self.not_verity,
                    "ok": ok,
                });
                print_stdout(format!("{doc:#}\n").as_bytes());
            }
            None => print_stdout(
                format!(
                    "verified {} files, {} corrupted, {} not verity\n",
                    self.verified, self.corrupted, self.not_verity
                )
                .as_bytes(),
            ),
        }
        match ok {
            true => Ok(()),
            false => Err(Error::reported()),
        }
    }
}

/// Prints a bad block as it is found (text output only).
fn print_corruption(json: bool, c: &Corruption) {
    if !json {
        print_stdout(format!("{c}\n").as_bytes());
    }
}

/// The per-file line (stdout) or error (stderr) of the text output.
fn print_text(name: &OsStr, report: &FileReport) {
    match &report.outcome {
        Outcome::Ok { blocks } => {
            print_stdout(&quote("", name, &format!(": OK ({blocks} blocks)\n")))
        }
        Outcome::OkThroughMount { bytes } => print_stdout(&quote(
            "",
            name,
            &format!(": OK ({bytes} bytes read through the mount, which verified them)\n"),
        )),
        Outcome::Corrupted {
            corrupted_blocks, ..
        } => print_stdout(&quote(
            "",
            name,
            &format!(": {corrupted_blocks} corrupted blocks\n"),
        )),
        Outcome::WrongDigest => {
            let digest = report.digest.as_deref().unwrap_or_default();
            print_stdout(&quote("", name, &format!(": FAILED: digest is {digest}\n")));
        }
        Outcome::NotVerity => {}
        Outcome::Stripped => error_msg(quote(
            "'",
            name,
            "' is a verity file that lost its extended attributes (copied without them?): \
             'verityfs reattach' restores it",
        )),
        Outcome::Invalid(why) => error_msg(quote(
            "'",
            name,
            &format!("' is not a valid verity file: {why}"),
        )),
        Outcome::Failed(why) => error_msg(quote("'", name, &format!("': {why}"))),
    }
}

/// One file's entry in the `--json` document.
fn json_report(path: &Path, report: &FileReport) -> serde_json::Value {
    let (result, blocks, bad, error) = match &report.outcome {
        Outcome::Ok { blocks } => ("ok", Some(*blocks), 0, None),
        Outcome::OkThroughMount { .. } => ("ok", None, 0, None),
        Outcome::Corrupted {
            blocks,
            corrupted_blocks,
        } => ("corrupted", Some(*blocks), *corrupted_blocks, None),
        Outcome::NotVerity => ("not_verity", None, 0, None),
        Outcome::Stripped => ("lost_extended_attributes", None, 0, None),
        Outcome::Invalid(why) => ("invalid", None, 0, Some(why.as_str())),
        Outcome::WrongDigest => ("wrong_digest", None, 0, None),
        Outcome::Failed(why) => ("error", None, 0, Some(why.as_str())),
    };
    let corruptions: Vec<serde_json::Value> = report
        .corruptions
        .iter()
        .map(|c| {
            serde_json::json!({
                "pos": c.pos,
                "level": c.level,
                "want_hash": format!("{}:{}", c.alg, c.want),
                "real_hash": format!("{}:{}", c.alg, c.real),
            })
        })
        .collect();
    serde_json::json!({
        "path": path.to_string_lossy(),
        "backing": report.backing.as_ref().map(|b| b.to_string_lossy()),
        "result": result,
        "digest": report.digest,
        "blocks": blocks,
        "corrupted_blocks": bad,
        "corruptions": corruptions,
        "error": error,
    })
}
