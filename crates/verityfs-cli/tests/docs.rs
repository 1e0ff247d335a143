//! `verityfs generate-docs`: the manual pages and shell completions that
//! packages install, generated from the command line's own tables. Needs
//! `bash` (for the completion checks).

use std::fs;
use std::path::Path;
use std::process::Command;

const VERITYFS: &str = env!("CARGO_BIN_EXE_verityfs");

/// The visible subcommands, as `verityfs --help` lists them.
fn subcommands() -> Vec<String> {
    let out = Command::new(VERITYFS).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    let names: Vec<String> = help
        .lines()
        .filter_map(|l| l.trim().strip_prefix("verityfs "))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter(|name| !name.starts_with('-'))
        .map(str::to_owned)
        .collect();
    assert!(names.len() >= 8, "{names:?}");
    names
}

/// Every `--option` a command's `--help` names.
fn usage_options(cmd: &str) -> Vec<String> {
    let out = Command::new(VERITYFS)
        .args([cmd, "--help"])
        .output()
        .unwrap();
    let usage = String::from_utf8(out.stdout).unwrap();
    let mut options: Vec<String> = usage
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.len() > 2 && w.starts_with("--"))
        .map(str::to_owned)
        .collect();
    options.sort();
    options.dedup();
    options
}

fn generate(dir: &Path) {
    let out = Command::new(VERITYFS)
        .arg("generate-docs")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `script` in bash with the generated completion loaded; returns
/// stdout.
fn bash(dir: &Path, script: &str) -> String {
    let completion = dir.join("completions/verityfs.bash");
    let out = Command::new("bash")
        .arg("--norc")
        .arg("-c")
        .arg(format!(
            "source '{}' || exit 9\n{script}",
            completion.display()
        ))
        .output()
        .expect("running bash");
    assert!(
        out.status.success(),
        "bash failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// What completing the last word of `line` offers (the words of `line`
/// split on spaces; a trailing space completes an empty word).
fn complete(dir: &Path, line: &str) -> Vec<String> {
    let mut words: Vec<&str> = line.split(' ').collect();
    if words.is_empty() {
        words.push("");
    }
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let cword = words.len() - 1;
    let prev = if cword > 0 { words[cword - 1] } else { "" };
    let script = format!(
        "COMP_WORDS=({}); COMP_CWORD={cword}; COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}\n\
         func=$(complete -p verityfs | sed -n 's/.*-F \\([^ ]*\\).*/\\1/p')\n\
         \"$func\" verityfs '{}' '{prev}' 2>/dev/null\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        quoted.join(" "),
        words[cword],
    );
    bash(dir, &script)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The options bash offers after `verityfs CMD -`.
fn bash_options(dir: &Path, cmd: &str) -> Vec<String> {
    complete(dir, &format!("verityfs {cmd} -"))
}

#[test]
fn generates_man_pages_and_completions() {
    let dir = tempfile::tempdir().unwrap();
    generate(dir.path());
    let man = dir.path().join("man");
    let root = fs::read_to_string(man.join("verityfs.1")).unwrap();
    assert!(root.contains("\n.TH verityfs 1 "), "{}", &root[..80]);
    let plain = |t: &str| t.replace("\\-", "-");
    let root = plain(&root);
    for cmd in subcommands() {
        assert!(root.contains(&format!("verityfs-{cmd}(1)")), "{cmd}");
        let page = plain(&fs::read_to_string(man.join(format!("verityfs-{cmd}.1"))).unwrap());
        let options = usage_options(&cmd);
        assert!(!options.is_empty() || cmd == "measure" || cmd == "stats" || cmd == "reattach");
        let offered = bash_options(dir.path(), &cmd);
        for opt in options {
            assert!(page.contains(&opt), "verityfs-{cmd}.1 lacks {opt}");
            assert!(
                offered.contains(&opt),
                "bash completion of {cmd} lacks {opt}"
            );
        }
        assert!(page.contains("--help"));
    }
    // The maintenance command is not documented.
    assert!(!root.contains("generate-docs"));
    assert!(!man.join("verityfs-generate-docs.1").exists());
    for file in ["verityfs.bash", "_verityfs", "verityfs.fish"] {
        let script = fs::read_to_string(dir.path().join("completions").join(file)).unwrap();
        for cmd in subcommands() {
            assert!(script.contains(&cmd), "{file} lacks {cmd}");
        }
        assert!(!script.contains("generate-docs"), "{file}");
    }
}

#[test]
fn generate_docs_usage_errors() {
    let out = Command::new(VERITYFS)
        .arg("generate-docs")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(VERITYFS)
        .args(["generate-docs", "/proc/version/x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("ERROR: "));
    // Hidden from the usage.
    let out = Command::new(VERITYFS).arg("--help").output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("generate-docs"));
}

#[test]
fn bash_completion() {
    let dir = tempfile::tempdir().unwrap();
    generate(dir.path());
    let completion = dir.path().join("completions/verityfs.bash");
    let check = Command::new("bash")
        .arg("-n")
        .arg(&completion)
        .status()
        .unwrap();
    assert!(check.success(), "bash -n {}", completion.display());
    let registered = bash(dir.path(), "complete -p verityfs");
    assert!(registered.contains("-F _verityfs"), "{registered}");

    assert_eq!(complete(dir.path(), "verityfs dig"), ["digest"]);
    assert_eq!(
        complete(dir.path(), "verityfs d"),
        ["digest", "dump_metadata"]
    );
    let all = complete(dir.path(), "verityfs ");
    for cmd in subcommands() {
        assert!(all.contains(&cmd), "{cmd} not offered: {all:?}");
    }
    assert!(!all.iter().any(|c| c == "generate-docs"));
    assert_eq!(
        complete(dir.path(), "verityfs digest f --hash"),
        ["--hash-alg"]
    );
    assert_eq!(
        complete(dir.path(), "verityfs digest --hash-alg "),
        ["sha256", "sha512"]
    );
    assert_eq!(
        complete(dir.path(), "verityfs mount a b --no"),
        ["--no-merkle-readahead"]
    );
    assert_eq!(
        complete(dir.path(), "verityfs dump_metadata mer"),
        ["merkle_tree"]
    );
}
