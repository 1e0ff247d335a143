//! The README agrees with what ships and what the tools print: it links
//! the security and format documents, which the Debian package installs;
//! digest lines in its examples have the separator `fsverity` prints; the
//! quick start's directories in the repository are ignored by git. Needs
//! `git` and `fsverity`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn security_and_format_documents_are_linked_and_packaged() {
    let readme = read("README.md");
    let manifest = read("crates/verityfs-cli/Cargo.toml");
    let package_check = read("scripts/package.sh");
    for doc in ["SECURITY.md", "FORMAT.md"] {
        assert!(repo().join("docs").join(doc).is_file(), "docs/{doc}");
        assert!(
            readme.contains(&format!("](docs/{doc})")),
            "README links docs/{doc}"
        );
        let asset = format!("[\"../../docs/{doc}\", \"usr/share/doc/verityfs/\", \"644\"]");
        assert!(manifest.contains(&asset), "the package ships {doc}");
        assert!(package_check.contains(&format!("usr/share/doc/verityfs/{doc}")));
    }
}

#[test]
fn digest_lines_have_the_separator_fsverity_prints() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    fs::write(&file, b"x").unwrap();
    let out = Command::new("fsverity")
        .arg("digest")
        .arg(&file)
        .output()
        .expect("fsverity (package fsverity) is needed");
    let printed = String::from_utf8(out.stdout).unwrap();
    let separator = &printed[printed.find(' ').unwrap()..printed.find('/').unwrap()];
    assert_eq!(separator, " ");

    let readme = read("README.md");
    let lines: Vec<&str> = readme
        .lines()
        .map(|l| l.trim_start_matches("# "))
        .filter(|l| l.starts_with("sha256:") || l.starts_with("sha512:"))
        .collect();
    assert!(!lines.is_empty());
    for line in lines {
        let after = &line[line.find(' ').unwrap_or_else(|| panic!("{line}"))..];
        assert!(
            after.starts_with(separator) && !after[1..].starts_with(' '),
            "README: {line:?} (fsverity prints {printed:?})"
        );
    }
}

#[test]
fn the_quick_start_directories_are_ignored_by_git() {
    for path in ["backing/file", "mnt/file"] {
        let status = Command::new("git")
            .arg("-C")
            .arg(repo())
            .args(["check-ignore", "-q", path])
            .status()
            .expect("git is needed");
        assert!(status.success(), "{path} is not ignored");
    }
}
