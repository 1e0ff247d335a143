//! Verifies a file shipped with its Merkle tree and descriptor kept apart
//! (a download, a container layer), and streams the verified data to
//! standard output.
//!
//! ```text
//! verify_download DATA TREE DESCRIPTOR [EXPECTED_DIGEST]
//! ```
//!
//! `TREE` and `DESCRIPTOR` are the files
//! `fsverity digest DATA --out-merkle-tree=TREE --out-descriptor=DESCRIPTOR`
//! writes (or `verityfs digest`, which takes the same options).
//! `EXPECTED_DIGEST` is the fs-verity digest the publisher announced, as
//! `fsverity digest` prints it (`sha256:HEX`) or as bare hex (`--compact`).
//! Without it, the data is only checked against the descriptor, which then
//! must come from a trusted source.
//!
//! Every block is checked against the tree before it is written; at the
//! first bad block the program stops with a message naming the file, the
//! position and the hashes, and exits with status 1. What it wrote before
//! is verified data, but incomplete: consumers must check the exit status.
//! Exit status: 0 verified, 1 corrupted or wrong digest or I/O error, 2
//! usage.
//!
//! Run it with `cargo run --example verify_download -- DATA TREE DESCRIPTOR`.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;
use std::process::ExitCode;

use verityfs::{ExpectedDigest, ReadOptions, VerifiedReader, Verifier, VerityFile};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let status = verify_download(&args, &mut io::stdout().lock(), &mut io::stderr());
    ExitCode::from(status)
}

/// The whole program, on the arguments after the program name: writes the
/// verified data to `out` and messages to `err`, returns the exit status.
pub fn verify_download(args: &[String], out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    if !(3..=4).contains(&args.len()) {
        let _ = writeln!(
            err,
            "Usage: verify_download DATA TREE DESCRIPTOR [EXPECTED_DIGEST]"
        );
        return 2;
    }
    let expected = args.get(3).map(String::as_str);
    match run(&args[0], &args[1], &args[2], expected, out) {
        Ok(()) => 0,
        Err(message) => {
            let _ = writeln!(err, "verify_download: ERROR: {message}");
            1
        }
    }
}

fn run(
    data: &str,
    tree: &str,
    descriptor: &str,
    expected: Option<&str>,
    out: &mut dyn Write,
) -> Result<(), String> {
    let open = |name: &str| File::open(name).map_err(|e| format!("can't open '{name}': {e}"));
    let descriptor_bytes =
        std::fs::read(descriptor).map_err(|e| format!("can't read '{descriptor}': {e}"))?;

    // One verifier holds the tree block cache; a program verifying many
    // files shares it between them.
    let verifier = Verifier::new(ReadOptions::default());
    let file = VerityFile::open_detached(
        &verifier,
        open(data)?,
        open(tree)?,
        &descriptor_bytes,
        Path::new(data),
    )
    .map_err(|e| format!("'{data}' with '{tree}' and '{descriptor}': {e}"))?;

    // The descriptor's hash is the file digest: the one value to trust.
    if let Some(expected) = expected {
        let parsed: ExpectedDigest = expected
            .trim()
            .parse()
            .map_err(|e| format!("'{expected}': {e}"))?;
        if !file.matches(&parsed) {
            let alg = file.descriptor().params().hash_algorithm();
            return Err(format!(
                "'{data}': digest mismatch: expected {expected}, the descriptor gives {alg}:{}",
                file.digest()
            ));
        }
    }

    let mut reader = VerifiedReader::new(&file);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(match verityfs::corruption(&e) {
                    // "DATA: FILE CORRUPTED! pos=..., level=..., want_hash=..., real_hash=..."
                    Some(corruption) => corruption.to_string(),
                    None => format!("reading '{data}': {e}"),
                });
            }
        };
        out.write_all(&buf[..n])
            .map_err(|e| format!("writing to standard output: {e}"))?;
    }
    out.flush()
        .map_err(|e| format!("writing to standard output: {e}"))
}
