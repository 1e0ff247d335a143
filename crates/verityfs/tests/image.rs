//! Images: publishing a real directory tree, reading it back verified, the
//! digests `fsverity digest` computes, tampering, and malformed manifests.

use verityfs::image::{Entry, EntryKind, Manifest, ManifestError};
use verityfs::HashAlgorithm;

/// A valid manifest of the root and `names` under it.
fn small_manifest(names: &[&str]) -> Vec<u8> {
    let dir = |parent, name: &str| Entry {
        parent,
        name: name.as_bytes().to_vec(),
        mode: 0o755,
        mtime: (1_700_000_000, 5),
        kind: EntryKind::Directory,
    };
    let mut entries = vec![dir(0, "")];
    entries.extend(names.iter().map(|n| dir(0, n)));
    Manifest::new(HashAlgorithm::Sha256, entries)
        .unwrap()
        .encode()
}

fn bad_entry(bytes: &[u8]) -> (u32, &'static str) {
    match Manifest::decode(bytes) {
        Err(ManifestError::BadEntry { index, reason }) => (index, reason),
        other => panic!("{other:?}"),
    }
}

/// Position of the name of entry `index` of a `small_manifest` (directory
/// entries of 24 bytes plus their names).
fn name_pos(names: &[&str], index: usize) -> usize {
    16 + 24 * (index + 1) + names[..index - 1].iter().map(|n| n.len()).sum::<usize>()
}

#[test]
fn malformed_manifests_get_typed_errors() {
    let names = ["ab", "cd"];
    let good = small_manifest(&names);
    Manifest::decode(&good).unwrap();
    let edit = |pos: usize, bytes: &[u8]| {
        let mut b = good.clone();
        b[pos..pos + bytes.len()].copy_from_slice(bytes);
        b
    };
    assert_eq!(
        Manifest::decode(&edit(0, b"XFSM")),
        Err(ManifestError::BadMagic)
    );
    assert_eq!(
        Manifest::decode(&edit(4, &[2])),
        Err(ManifestError::UnsupportedVersion(2))
    );
    assert_eq!(
        Manifest::decode(&edit(5, &[9])),
        Err(ManifestError::UnknownHashAlgorithm(9))
    );
    assert_eq!(
        Manifest::decode(&edit(8, &[0, 0, 0, 0])),
        Err(ManifestError::BadEntryCount(0))
    );
    assert_eq!(
        Manifest::decode(&edit(8, &[0, 0, 0, 1])),
        Err(ManifestError::BadEntryCount(1 << 24))
    );
    assert_eq!(
        Manifest::decode(&edit(8, &[100, 0, 0, 0])),
        Err(ManifestError::Truncated)
    );
    let mut trailing = good.clone();
    trailing.push(0);
    assert_eq!(
        Manifest::decode(&trailing),
        Err(ManifestError::TrailingBytes)
    );
    let second = name_pos(&names, 2);
    assert_eq!(bad_entry(&edit(second, b"ab")).0, 2, "duplicate");
    assert_eq!(
        bad_entry(&edit(second, b"aa")),
        (
            2,
            "entries not sorted by parent and name, or a duplicate name"
        )
    );
    assert_eq!(bad_entry(&edit(second, b"..")), (2, "name is . or .."));
    assert_eq!(
        bad_entry(&edit(second, b"c/")),
        (2, "name contains / or NUL")
    );
    assert_eq!(
        bad_entry(&edit(second, b"c\0")),
        (2, "name contains / or NUL")
    );
    let entry2 = second - 24;
    assert_eq!(
        bad_entry(&edit(entry2, &[2, 0, 0, 0])),
        (2, "parent is not an earlier entry")
    );
    assert_eq!(bad_entry(&edit(entry2 + 4, &[7])), (2, "unknown kind"));
    assert_eq!(
        bad_entry(&edit(entry2 + 6, &[0, 0o20])),
        (2, "mode has bits other than permissions")
    );
    assert_eq!(
        bad_entry(&edit(entry2 + 16, &[0, 0xca, 0x9a, 0x3b])),
        (2, "nanoseconds out of range")
    );
    assert_eq!(
        bad_entry(&edit(entry2 + 20, &[1])),
        (2, "reserved bytes set")
    );
    assert_eq!(bad_entry(&edit(16 + 5, &[1])).0, 0, "a root with a name");
    // Every truncation is refused, every single-byte change is refused or
    // decodes to something that encodes back to itself; none panics.
    for len in 0..good.len() {
        assert!(
            Manifest::decode(&good[..len]).is_err(),
            "prefix of {len} bytes"
        );
    }
    for (pos, byte) in good.iter().enumerate() {
        for bit in 0..8 {
            let changed = edit(pos, &[byte ^ (1 << bit)]);
            if let Ok(m) = Manifest::decode(&changed) {
                assert_eq!(m.encode(), changed);
            }
        }
    }
}

#[test]
fn manifest_limits() {
    let dir = |parent: u32, name: &[u8]| Entry {
        parent,
        name: name.to_vec(),
        mode: 0o755,
        mtime: (0, 0),
        kind: EntryKind::Directory,
    };
    // 2048 levels below the root are allowed, not 2049.
    let mut deep = vec![dir(0, b"")];
    deep.extend((0..2048).map(|i| dir(i, b"d")));
    let m = Manifest::new(HashAlgorithm::Sha256, deep.clone()).unwrap();
    assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
    let mut path = vec![b'd'; 2048 * 2 - 1];
    path.iter_mut().skip(1).step_by(2).for_each(|b| *b = b'/');
    assert_eq!(m.lookup(&path), Some(2048));
    deep.push(dir(2048, b"d"));
    let err = Manifest::new(HashAlgorithm::Sha256, deep).unwrap_err();
    assert_eq!(
        err,
        ManifestError::BadEntry {
            index: 2049,
            reason: "deeper than the limit"
        }
    );
    let long = |n| vec![dir(0, b""), dir(0, &vec![b'x'; n])];
    Manifest::new(HashAlgorithm::Sha256, long(255)).unwrap();
    let err = Manifest::new(HashAlgorithm::Sha256, long(256)).unwrap_err();
    assert_eq!(
        err,
        ManifestError::BadEntry {
            index: 1,
            reason: "name longer than 255 bytes"
        }
    );
    let link = |n| Entry {
        kind: EntryKind::Symlink(vec![b'x'; n]),
        ..dir(0, b"l")
    };
    Manifest::new(HashAlgorithm::Sha256, vec![dir(0, b""), link(4095)]).unwrap();
    let err = Manifest::new(HashAlgorithm::Sha256, vec![dir(0, b""), link(4096)]).unwrap_err();
    assert!(
        matches!(err, ManifestError::BadEntry { index: 1, .. }),
        "{err:?}"
    );
    let err = Manifest::new(HashAlgorithm::Sha256, vec![dir(0, b""), link(0)]).unwrap_err();
    assert!(
        matches!(err, ManifestError::BadEntry { index: 1, .. }),
        "{err:?}"
    );
    assert_eq!(
        Manifest::new(HashAlgorithm::Sha256, vec![]),
        Err(ManifestError::BadEntryCount(0))
    );
}
