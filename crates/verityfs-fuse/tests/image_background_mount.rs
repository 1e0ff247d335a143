//! An image mounted through the crate's public API: [`ImageFs::open`]
//! checks the manifest against the digest, and [`BackgroundMount::spawn_image`]
//! serves it, here on the image's own directory (its files are read through
//! the directory opened before the mount hides it).
//!
//! Mounting FUSE needs root and `/dev/fuse`: without them the test fails
//! and says so.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use verityfs::image::{publish, DirStore, ManifestTrust};
use verityfs::{Error, MerkleTreeParams, ReadOptions};
use verityfs_fuse::{BackgroundMount, ImageFs, MountOptions};

fn is_mounted(path: &Path) -> bool {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    mountinfo
        .lines()
        .any(|line| line.split(' ').nth(4) == path.to_str())
}

#[test]
fn an_image_mounted_over_its_own_directory_serves_its_tree() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let (src, image) = (base.join("src"), base.join("image"));
    fs::create_dir_all(src.join("etc")).unwrap();
    fs::write(src.join("etc/motd"), b"hello\n").unwrap();
    let published = publish(&src, &image, &MerkleTreeParams::default()).unwrap();
    let digest = ManifestTrust::Digest(format!("sha256:{}", published.digest).parse().unwrap());
    let store = Arc::new(DirStore::new(&image).unwrap());

    let wrong = ManifestTrust::Digest(format!("sha256:{}", "00".repeat(32)).parse().unwrap());
    let refused = ImageFs::open(store.clone(), &wrong, ReadOptions::default());
    assert!(
        matches!(refused, Err(Error::Corrupted(_))),
        "{:?}",
        refused.err()
    );

    let fs = ImageFs::open(store, &digest, ReadOptions::default()).unwrap();
    assert_eq!(fs.entries(), 3);
    let mount = BackgroundMount::spawn_image(fs, "test-image", &image, MountOptions::default())
        .unwrap_or_else(|e| panic!("mounting (needs root and /dev/fuse): {e}"));
    assert!(is_mounted(&image));
    assert_eq!(fs::read(image.join("etc/motd")).unwrap(), b"hello\n");
    let names: Vec<_> = fs::read_dir(&image)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["etc"]);
    mount.unmount().unwrap();
    assert!(!is_mounted(&image));
    assert!(image.join("manifest").is_file(), "the image is intact");
}
