//! Images end to end: `verityfs publish` a tree, `verityfs mount --digest`
//! it (real FUSE mounts, as root and read by `nobody`), and compare what
//! the mount serves with the source: names, kinds, modes, sizes, times,
//! symlink targets, every byte, and `fsverity measure` (the real binary)
//! against `fsverity digest` of the source files. A wrong digest or a
//! damaged object must be refused.

mod common;

use std::fs::{self, File, OpenOptions, Permissions};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use common::images::*;
use common::*;

/// The 3 MB file's size: not a multiple of the block size.
const BIG_SIZE: usize = 3_000_000;

#[test]
fn the_mount_serves_the_published_tree_with_its_digests() {
    let image = Image::publish(BIG_SIZE);
    let mount = image.mount(&[]);
    let source = listing(&image.src);
    assert_eq!(listing(&mount.mnt), source);
    assert_eq!(source.len(), 14, "{source:#?}");
    for name in regular_files(&source) {
        let (served, original) = (mount.mnt.join(name), image.src.join(name));
        assert!(
            fs::read(&served).unwrap() == fs::read(&original).unwrap(),
            "{name:?} differs"
        );
        assert_eq!(measure(&served), digest(&original, &[]), "{name:?}");
    }
    // Directories link to themselves, from their parent and from each
    // subdirectory.
    for (dir, links) in [("", 4), ("a", 3), ("a/b/c", 2), ("empty dir", 2)] {
        let m = fs::metadata(mount.mnt.join(dir)).unwrap();
        assert_eq!(m.nlink(), links, "{dir:?}");
    }
    // Every data block of the 3 MB file went through the verifier.
    let verified = counter(&mount.mnt, "data_blocks_verified");
    assert!(verified >= BIG_SIZE.div_ceil(4096) as u64, "{verified}");
    // Owners are the mounting user's: root here.
    for listed in listing(&mount.mnt) {
        let m = fs::symlink_metadata(mount.mnt.join(&listed.path)).unwrap();
        assert_eq!((m.uid(), m.gid()), (0, 0), "{:?}", listed.path);
    }
    let options = mount_options(&mount.mnt);
    for option in ["ro", "nosuid", "nodev"] {
        assert!(options.split(',').any(|o| o == option), "{options}");
    }
}

#[test]
fn nothing_changes_through_the_mount() {
    let image = Image::publish(BIG_SIZE);
    let mount = image.mount(&[]);
    let path = |name: &str| mount.path(name);
    let erofs = libc::EROFS;
    assert_errno(fs::write(path("new"), b"x"), erofs, "create");
    let write = OpenOptions::new().write(true).open(path("big"));
    assert_errno(write, erofs, "open for writing");
    assert_errno(fs::create_dir(path("d")), erofs, "mkdir");
    assert_errno(fs::remove_file(path("empty")), erofs, "unlink");
    assert_errno(fs::rename(path("empty"), path("e2")), erofs, "rename");
    let chmod = fs::set_permissions(path("big"), Permissions::from_mode(0o777));
    assert_errno(chmod, erofs, "chmod");
    let symlink = std::os::unix::fs::symlink("x", path("l"));
    assert_errno(symlink, erofs, "symlink");
    // FS_IOC_ENABLE_VERITY on a file that already is verity.
    assert_enable_fails(&path("big"), &[], erofs);
    assert_eq!(listing(&mount.mnt), listing(&image.src));
}

#[test]
fn nobody_reads_what_the_modes_allow() {
    let image = Image::publish(BIG_SIZE);
    let mount = image.mount(&["-o", "allow_other"]);
    let as_nobody = |program: &str, path: &Path| {
        run(Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", program])
            .arg(path))
    };
    for name in ["big", "a/run.sh", UNICODE_NAME] {
        let out = as_nobody("cat", &mount.path(name));
        assert!(out.status.success(), "{name}: {out:?}");
        assert!(
            out.stdout == fs::read(image.src.join(name)).unwrap(),
            "{name}"
        );
    }
    let measured = run(Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            FSVERITY,
            "measure",
        ])
        .arg(mount.path("a/run.sh")));
    let line = String::from_utf8_lossy(&measured.stdout);
    assert!(
        line.starts_with(&digest(&image.src.join("a/run.sh"), &[])),
        "{measured:?}"
    );
    // A file of mode 0600 and one in a directory of mode 0750, owned by
    // root: refused by the kernel's permission check.
    for name in ["a/private", "a/b/c/deep"] {
        let out = as_nobody("cat", &mount.path(name));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("Permission denied"),
            "{name}: {out:?}"
        );
    }
}

#[test]
fn a_wrong_digest_is_refused_before_mounting() {
    let image = Image::publish(BIG_SIZE);
    let mnt = image.image.with_file_name("mnt");
    let last = image.digest.chars().last().unwrap();
    let flipped = if last == '0' { '1' } else { '0' };
    let wrong = format!("{}{flipped}", &image.digest[..image.digest.len() - 1]);
    let out = mount_image(&image.image, &mnt, &[&format!("--digest={wrong}")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("FILE CORRUPTED!"), "{stderr}");
    assert!(
        stderr.contains(&wrong[7..]),
        "names the digest wanted: {stderr}"
    );
    assert!(stderr.contains("does not match --digest"), "{stderr}");
    assert!(!is_mounted(&mnt));

    // The manifest damaged: its digest still matches, its tree does not.
    flip_byte(&image.image.join("manifest"), 20);
    let out = mount_image(&image.image, &mnt, &[&format!("--digest={}", image.digest)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("FILE CORRUPTED!"), "{stderr}");
    assert!(!is_mounted(&mnt));
}

#[test]
fn an_image_directory_behind_another_user_s_link_is_refused() {
    let image = Image::publish(BIG_SIZE);
    let (home, mnt) = (
        image.image.with_file_name("home"),
        image.image.with_file_name("mnt"),
    );
    fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(NOBODY), Some(NOBODY)).unwrap();
    let link = home.join("image");
    std::os::unix::fs::symlink(&image.image, &link).unwrap();
    let nobody = rustix::fs::Uid::from_raw(NOBODY);
    let flags = rustix::fs::AtFlags::SYMLINK_NOFOLLOW;
    rustix::fs::chownat(rustix::fs::CWD, &link, Some(nobody), None, flags).unwrap();
    let out = mount_image(&link, &mnt, &[&format!("--digest={}", image.digest)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let refused = format!("'{}' is a symbolic link of uid {NOBODY}", link.display());
    assert!(stderr.contains(&refused), "{stderr}");
    assert!(!is_mounted(&mnt));
}

#[test]
fn images_need_a_valid_digest_and_options_for_their_kind() {
    let image = Image::publish(BIG_SIZE);
    let mnt = image.image.with_file_name("mnt");
    let usage = |args: &[&str], source: &Path, message: &str| {
        let out = mount_image(source, &mnt, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    };
    let good = format!("--digest={}", image.digest);
    usage(&["--digest=sha256:xyz"], &image.image, "invalid digest");
    let url = Path::new("https://example.com/image");
    usage(&[], url, "an image needs --digest");
    usage(&[&good, "--timeout=0"], url, "invalid timeout");
    usage(
        &[&good, "--timeout=5"],
        &image.image,
        "--timeout applies to images over HTTP or S3",
    );
    // Nothing listens there: the mount fails at once, naming the image.
    let refused = Path::new("http://127.0.0.1:1/image");
    let out = mount_image(refused, &mnt, &[&good, "--timeout=5"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("can't read the manifest of image 'http://127.0.0.1:1/image'"),
        "{stderr}"
    );
    usage(
        &[&good, "--create"],
        &image.image,
        "--create applies to backing",
    );
    assert!(!is_mounted(&mnt));
}

#[test]
fn a_damaged_object_fails_its_block_only() {
    let image = Image::publish(BIG_SIZE);
    let damaged = BIG_SIZE as u64 - 100;
    flip_byte(&image.object_of("big"), damaged);
    let mount = image.mount(&[]);
    assert_damaged_block_only(&mount, &image.src, damaged);
}

/// A descriptor that is not even valid (its version byte changed) must
/// have the digest the manifest gives, so it is tampering: `EIO` at open,
/// as for any other changed byte (a local verity file's gets `EINVAL`).
#[test]
fn a_garbled_descriptor_fails_its_file_with_eio() {
    let image = Image::publish(BIG_SIZE);
    let object = image.object_of("big");
    // An object ends with its 256-byte descriptor.
    let descriptor = fs::metadata(&object).unwrap().len() - 256;
    flip_byte(&object, descriptor);
    let mount = image.mount(&[]);
    assert_errno(File::open(mount.path("big")), libc::EIO, "open");
    let deep = fs::read(mount.path("a/b/c/deep")).unwrap();
    assert_eq!(deep, b"deep\n", "other files are fine");
    assert!(
        mount.log().contains("descriptor tampered with"),
        "{}",
        mount.log()
    );
}

#[test]
fn publish_warns_about_what_it_skips() {
    prerequisites();
    let dir = tempfile::tempdir().unwrap();
    let (src, image) = (dir.path().join("src"), dir.path().join("image"));
    fs::create_dir(&src).unwrap();
    fs::write(src.join("file"), b"x").unwrap();
    run_ok(Command::new("mkfifo").arg(src.join("fifo")));
    let out = run(Command::new(VERITYFS).arg("publish").arg(&src).arg(&image));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.starts_with("sha256:") && stdout.lines().count() == 1,
        "{stdout}"
    );
    let warning = format!("WARNING: skipped '{}'", src.join("fifo").display());
    assert!(stderr.contains(&warning), "{stderr}");

    let missing = dir.path().join("missing");
    let out = run(Command::new(VERITYFS)
        .arg("publish")
        .arg(&missing)
        .arg(&image));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("No such file or directory"), "{stderr}");
    let out = run(Command::new(VERITYFS).arg("publish").arg(&src));
    assert_eq!(out.status.code(), Some(2), "one operand is a usage error");
}

/// Runs `verityfs mount SOURCE MNT ARGS`, which must exit (bounded).
fn mount_image(source: &Path, mnt: &Path, args: &[&str]) -> std::process::Output {
    run(Command::new(VERITYFS)
        .arg("mount")
        .arg(source)
        .arg(mnt)
        .args(args))
}

/// The options of the mount on `mnt`, as /proc/mounts lists them.
fn mount_options(mnt: &Path) -> String {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    let line = mounts
        .lines()
        .rfind(|l| l.split(' ').nth(1) == Some(&*mnt.to_string_lossy()))
        .unwrap_or_else(|| panic!("{} not mounted", mnt.display()));
    line.split(' ').nth(3).unwrap().to_owned()
}
