//! `verityfs verify` and `verityfs dump_metadata` on real verity files.
//! Usage errors of `dump_metadata` are fsverity-utils v1.5's, byte for byte
//! (checked against `/usr/bin/fsverity`); the program is run in a scratch
//! directory with relative paths, so that messages are predictable.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use verityfs::{
    build_merkle_tree, enable_verity, Descriptor, EnableRequest, HashAlgorithm, MerkleTreeParams,
};

const OURS: &str = env!("CARGO_BIN_EXE_verityfs");

/// Exit status, stdout and stderr of `verityfs args...` run in `dir`.
fn run(dir: &Path, args: &[&str]) -> (i32, Vec<u8>, String) {
    let out = Command::new(OURS)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    (out.status.code().unwrap(), out.stdout, stderr)
}

/// `run` for commands whose stdout is text.
fn run_text(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let (status, stdout, stderr) = run(dir, args);
    (status, String::from_utf8(stdout).unwrap(), stderr)
}

fn data(size: usize, seed: u8) -> Vec<u8> {
    (0..size).map(|i| (i % 251) as u8 ^ seed).collect()
}

/// Creates `dir/name` holding `data` and, with `params`, enables verity on
/// it (storing `signature`). Returns the descriptor and the tree.
fn create(
    dir: &Path,
    name: &str,
    data: &[u8],
    params: Option<MerkleTreeParams>,
    signature: Option<&[u8]>,
) -> (Descriptor, Vec<u8>) {
    let path = dir.join(name);
    fs::write(&path, data).unwrap();
    let params = params.unwrap_or_default();
    let (descriptor, tree) = build_merkle_tree(
        &params,
        data.len() as u64,
        data,
        Vec::new(),
        &mut |_| Ok(()),
    )
    .unwrap();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let request = EnableRequest {
        params,
        signature,
        progress: &mut |_| true,
    };
    enable_verity(&file, request).unwrap();
    (descriptor, tree)
}

fn flip_byte(path: &Path, pos: u64) {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    file.read_exact_at(&mut b, pos).unwrap();
    file.write_all_at(&[!b[0]], pos).unwrap();
}

/// The verityfs layout puts the descriptor after the data (rounded up to
/// 64 KiB) and the tree.
fn descriptor_pos(data_size: u64, tree_size: u64) -> u64 {
    data_size.next_multiple_of(65536) + tree_size
}

#[test]
fn verify_reports_every_bad_block_and_every_broken_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    fs::create_dir_all(dir.join("sub")).unwrap();
    let params = MerkleTreeParams::new(HashAlgorithm::Sha256, 1024, b"").unwrap();
    let good = data(3 * 4096, 1);
    create(&dir, "a_good", &good, None, None);
    let bad = data(10 * 1024 + 5, 2);
    create(&dir, "b_bad", &bad, Some(params), None);
    flip_byte(&dir.join("b_bad"), 2 * 1024 + 9);
    flip_byte(&dir.join("b_bad"), 10 * 1024 + 1); // the partial last block
    fs::write(dir.join("c_plain"), b"not verity").unwrap();
    let (descriptor, tree) = create(&dir, "d_broken", &data(5000, 3), None, None);
    flip_byte(
        &dir.join("d_broken"),
        descriptor_pos(5000, tree.len() as u64),
    );
    assert_eq!(descriptor.data_size(), 5000);
    create(&dir, "sub/e_good", b"x", None, None);
    std::os::unix::fs::symlink("a_good", dir.join("f_link")).unwrap();

    let (status, stdout, stderr) = run_text(tmp.path(), &["verify", "d"]);
    let hash = |block: &[u8]| {
        let mut padded = block.to_vec();
        padded.resize(1024, 0);
        format!("sha256:{}", params.hasher().hash_block(&padded))
    };
    let corrupted = |pos: usize| {
        let mut block = bad[pos..(pos + 1024).min(bad.len())].to_vec();
        let original = hash(&block);
        block[if pos == 2048 { 9 } else { 1 }] ^= 0xff;
        format!(
            "d/b_bad: FILE CORRUPTED! pos={pos}, level=-1, want_hash={original}, real_hash={}\n",
            hash(&block)
        )
    };
    let want = format!(
        "d/a_good: OK (3 blocks)\n{}{}d/b_bad: 2 corrupted blocks\n\
         d/sub/e_good: OK (1 blocks)\nverified 4 files, 2 corrupted, 1 not verity\n",
        corrupted(2048),
        corrupted(10240),
    );
    assert_eq!(stdout, want);
    assert_eq!(
        stderr,
        "ERROR: 'd/d_broken' is not a valid verity file: \
         invalid fs-verity descriptor: unrecognized version\n"
    );
    assert_eq!(status, 1);

    // Good files only (a symlink named on the command line is followed).
    let (status, stdout, stderr) = run_text(&dir, &["verify", "sub", "f_link"]);
    let want = "sub/e_good: OK (1 blocks)\nf_link: OK (3 blocks)\n\
                verified 2 files, 0 corrupted, 0 not verity\n";
    assert_eq!((status, stdout.as_str(), stderr.as_str()), (0, want, ""));

    // An ordinary file named on the command line was not verified: an
    // error, not an all-clear.
    let (status, stdout, stderr) = run_text(&dir, &["verify", "sub", "c_plain"]);
    let want = "sub/e_good: OK (1 blocks)\nverified 1 files, 0 corrupted, 1 not verity\n";
    assert_eq!(
        (status, stdout.as_str(), stderr.as_str()),
        (1, want, "ERROR: 'c_plain' is not a verity file\n")
    );

    // Metadata cut off.
    let file = OpenOptions::new()
        .write(true)
        .open(dir.join("a_good"))
        .unwrap();
    file.set_len(65536 + 100).unwrap();
    let (status, stdout, stderr) = run_text(&dir, &["verify", "a_good", "missing"]);
    assert_eq!(stdout, "verified 1 files, 1 corrupted, 0 not verity\n");
    assert_eq!(
        stderr,
        "ERROR: 'a_good' is not a valid verity file: verity metadata is truncated\n\
         ERROR: can't stat 'missing': No such file or directory\n"
    );
    assert_eq!(status, 1);
}

#[test]
fn verify_usage_errors_and_help() {
    let tmp = tempfile::tempdir().unwrap();
    let usage = "Usage: verityfs verify [OPTIONS] [PATH...]\n\
                 Try 'verityfs verify --help' for more information.\n";
    assert_eq!(
        run_text(tmp.path(), &["verify"]),
        (2, String::new(), usage.into())
    );
    let (status, stdout, stderr) = run_text(tmp.path(), &["verify", "x", "--all"]);
    assert_eq!((status, stdout.as_str()), (2, ""));
    assert_eq!(stderr, format!("ERROR: unknown option '--all'\n{usage}"));
    let (status, help, stderr) = run_text(tmp.path(), &["verify", "--help"]);
    assert_eq!((status, stderr.as_str()), (0, ""));
    assert!(
        help.starts_with("Check every block of the verity files at the given path(s)\n"),
        "{help}"
    );
    for described in [
        "  -c, --check=LIST\n          Check the files listed in LIST (- for stdin)",
        "      --tree=TREE_FILE\n          Check FILE against this separate Merkle tree",
        "      --json\n",
        "  PATH...",
    ] {
        assert!(help.contains(described), "{described:?} in {help}");
    }
    for args in [&["verify", "-h"][..], &["help", "verify"]] {
        assert_eq!(run_text(tmp.path(), args), (0, help.clone(), String::new()));
    }
}

#[test]
fn dump_metadata_returns_what_was_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let params = MerkleTreeParams::new(HashAlgorithm::Sha512, 1024, b"salt").unwrap();
    let signature = data(1500, 7);
    let (descriptor, tree) = create(dir, "f", &data(1 << 20, 4), Some(params), Some(&signature));
    let tree_size = tree.len();
    assert!(
        tree_size > 32768,
        "the tree takes several default-sized reads"
    );
    for (kind, want) in [
        ("merkle_tree", tree),
        ("descriptor", descriptor.to_unsigned_bytes().to_vec()),
        ("signature", signature),
    ] {
        assert_eq!(
            run(dir, &["dump_metadata", kind, "f"]),
            (0, want.clone(), String::new())
        );
        // Pieces of 13 bytes only for the small items: one run each.
        for chunk in [997, 13]
            .into_iter()
            .filter(|&c| c > 13 || want.len() < 2000)
        {
            let mut got = Vec::new();
            for offset in (0..want.len() + chunk).step_by(chunk) {
                let (offset, length) = (format!("--offset={offset}"), format!("--length={chunk}"));
                let (status, stdout, stderr) =
                    run(dir, &["dump_metadata", kind, "f", &offset, &length]);
                assert_eq!((status, stderr.as_str()), (0, ""), "{kind} {offset}");
                got.extend(stdout);
            }
            assert!(got == want, "{kind} in {chunk}-byte pieces");
        }
        // Past the end, a huge length (clamped to INT_MAX, as the kernel does)
        // and offsets near 2^64 read nothing.
        for (offset, length) in [("1000000", "5"), ("0", "999999999999999"), ("-1", "0")] {
            let args = [
                "dump_metadata",
                kind,
                "f",
                "--offset",
                offset,
                "--length",
                length,
            ];
            let (status, stdout, stderr) = run(dir, &args);
            assert_eq!((status, stderr.as_str()), (0, ""), "{args:?}");
            let want = if offset == "0" { &want[..] } else { &[][..] };
            assert!(stdout == want, "{args:?}");
        }
    }
}

#[test]
fn dump_metadata_errors_are_the_ioctls() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    fs::write(dir.join("plain"), b"abc").unwrap();
    let (_, tree) = create(dir, "unsigned", &data(5000, 5), None, None);
    create(dir, "broken", &data(5000, 5), None, None);
    flip_byte(
        &dir.join("broken"),
        descriptor_pos(5000, tree.len() as u64) + 200,
    );
    let failed = |name: &str, why: &str| {
        format!("ERROR: FS_IOC_READ_VERITY_METADATA failed on '{name}': {why}\n")
    };
    for (args, want) in [
        (
            &["merkle_tree", "plain"][..],
            failed("plain", "No data available"),
        ),
        (
            &["signature", "unsigned"],
            failed("unsigned", "No data available"),
        ),
        (
            &["descriptor", "broken"],
            failed("broken", "Invalid argument"),
        ),
        (
            &["descriptor", "unsigned", "--offset=-1", "--length=1"],
            failed("unsigned", "Invalid argument"),
        ),
        (
            &["descriptor", "missing"],
            "ERROR: can't open 'missing' for reading: No such file or directory\n".into(),
        ),
    ] {
        let args = [&["dump_metadata"], args].concat();
        assert_eq!(run_text(dir, &args), (1, String::new(), want), "{args:?}");
    }
}

/// Every usage error, as fsverity v1.5 reports it (with our program name).
#[test]
fn dump_metadata_usage_errors_match_fsverity() {
    let tmp = tempfile::tempdir().unwrap();
    let usage =
        "Usage:\n    verityfs dump_metadata TYPE FILE [--offset=OFFSET] [--length=LENGTH]\n";
    File::create(tmp.path().join("f")).unwrap();
    for (args, message) in [
        (&[][..], ""),
        (&["merkle_tree"], ""),
        (&["merkle_tree", "f", "g"], ""),
        (
            &["tree", "f"],
            "ERROR: unknown metadata type: tree\n       \
             Expected \"merkle_tree\", \"descriptor\", or \"signature\"\n",
        ),
        (
            &["descriptor", "f", "--offset=1"],
            "ERROR: --offset specified without --length\n",
        ),
        (
            &["descriptor", "f", "--length=1"],
            "ERROR: --length specified without --offset\n",
        ),
        (
            &["descriptor", "f", "--offset=0x10", "--length=1"],
            "ERROR: invalid value for --offset\n",
        ),
        (
            &["descriptor", "f", "--offset=1", "--length=1e3"],
            "ERROR: invalid value for --length\n",
        ),
        (
            &[
                "descriptor",
                "f",
                "--offset=0",
                "--length=18446744073709551616",
            ],
            "ERROR: invalid value for --length\n",
        ),
        (
            &["descriptor", "f", "--offset=1", "--offset=1", "--length=1"],
            "ERROR: --offset can only be specified once\n",
        ),
        (
            &["descriptor", "f", "--len=1", "--len=1"],
            "ERROR: --length can only be specified once\n",
        ),
        (
            &["descriptor", "f", "--size=1"],
            "dump_metadata: unrecognized option '--size=1'\n",
        ),
        (
            &["descriptor", "f", "--offset"],
            "dump_metadata: option '--offset' requires an argument\n",
        ),
        // The type is checked before the options are paired up.
        (
            &["tree", "f", "--length=1"],
            "ERROR: unknown metadata type: tree\n       \
             Expected \"merkle_tree\", \"descriptor\", or \"signature\"\n",
        ),
    ] {
        let args = [&["dump_metadata"], args].concat();
        let want = (2, String::new(), format!("{message}{usage}"));
        assert_eq!(run_text(tmp.path(), &args), want, "{args:?}");
    }
    let help = run_text(tmp.path(), &["dump_metadata", "--help"]);
    assert_eq!(help, (0, usage.into(), String::new()));
}
