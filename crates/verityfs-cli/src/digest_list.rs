//! Lists of expected digests for `verityfs verify --check=LIST`, in the
//! format `fsverity digest` and `fsverity measure` print: one
//! `ALG:HEX FILE` per line. As with `sha256sum -c`, a second space or a
//! `*` before the name is also accepted, as are bare hexadecimal digests;
//! empty lines and lines starting with `#` are skipped.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use verityfs::ExpectedDigest;

/// One line of a list.
#[derive(Debug, PartialEq, Eq)]
pub struct Entry {
    /// The digest the file must have.
    pub expected: ExpectedDigest,
    /// The file, as written (relative names are relative to the current
    /// directory).
    pub path: PathBuf,
}

/// Parses `text`: the entries, and the 1-based numbers of malformed lines.
pub fn parse(text: &[u8]) -> (Vec<Entry>, Vec<usize>) {
    let mut entries = Vec::new();
    let mut malformed = Vec::new();
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        if line.is_empty() || line.starts_with(b"#") {
            continue;
        }
        match parse_line(line) {
            Some(entry) => entries.push(entry),
            None => malformed.push(i + 1),
        }
    }
    (entries, malformed)
}

fn parse_line(line: &[u8]) -> Option<Entry> {
    let space = line.iter().position(|&b| b == b' ')?;
    let expected = std::str::from_utf8(&line[..space]).ok()?.parse().ok()?;
    let mut name = &line[space + 1..];
    if let Some(rest) = name.strip_prefix(b" ").or_else(|| name.strip_prefix(b"*")) {
        name = rest;
    }
    (!name.is_empty()).then(|| Entry {
        expected,
        path: PathBuf::from(OsStr::from_bytes(name)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fsverity_and_sha256sum_styles() {
        let hex = "ab".repeat(32);
        let text = format!(
            "sha256:{hex} a\n# comment\n\n{hex}  b c\nsha256:{hex} *d\nsha256:{hex}\nsha512:{hex} e\nnonsense\n"
        );
        let (entries, malformed) = parse(text.as_bytes());
        let names: Vec<_> = entries.iter().map(|e| e.path.to_str().unwrap()).collect();
        assert_eq!(names, ["a", "b c", "d"]);
        assert_eq!(malformed, [6, 7, 8]);
        assert_eq!(entries[0].expected.to_string(), format!("sha256:{hex}"));
        assert_eq!(entries[1].expected.algorithm(), None);
    }
}
