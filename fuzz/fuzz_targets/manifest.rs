//! Arbitrary bytes as an image manifest (`Manifest::decode`): no panic; at
//! most 16 times the input's size allocated (no count is trusted); what decodes re-encodes to
//! exactly the input (the encoding is canonical), passes `Manifest::new`'s
//! checks, and every entry is found again by its parent and name and among
//! its parent's children.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use verityfs::image::{EntryKind, Manifest};

fuzz_target!(|data: &[u8]| {
    let (decoded, allocated) = common::allocated_by(|| Manifest::decode(data));
    assert!(allocated <= 16 * data.len() as u64 + 1024, "{allocated} bytes allocated");
    let Ok(manifest) = decoded else { return };
    assert_eq!(manifest.encode(), data, "not canonical");
    let entries = manifest.entries();
    let rebuilt = Manifest::new(manifest.algorithm(), entries.to_vec()).expect("decoded entries");
    assert_eq!(rebuilt, manifest);
    assert_eq!(manifest.lookup(b"/"), Some(0));
    for (i, entry) in entries.iter().enumerate().skip(1) {
        let i = i as u32;
        assert_eq!(manifest.child(entry.parent, &entry.name), Some(i));
        assert!(manifest.children(entry.parent).contains(&i));
        assert_eq!(entries[entry.parent as usize].kind, EntryKind::Directory);
    }
});
