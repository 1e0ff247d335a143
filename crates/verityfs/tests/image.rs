//! Images: publishing a real directory tree, reading it back verified, the
//! digests `fsverity digest` computes, tampering, and malformed manifests.

mod common;

use std::fs::{self, File};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use verityfs::image::{
    open_manifest, open_object, publish, publish_signed, Entry, EntryKind, Manifest, ManifestError,
    ManifestTrust, Published, MANIFEST_NAME,
};
use verityfs::signature::{sign_digest_with, Certificate, SigningKey};
use verityfs::{
    Digest, Error, ExpectedDigest, HashAlgorithm, MerkleTreeParams, ReadOptions, SignatureError,
    Verifier, VerityFile,
};

/// A source tree with what an image must carry: nested directories, empty
/// files, a 3 MB file, duplicate contents, Unicode names, symlinks
/// (relative, absolute, dangling, to a directory) and a FIFO.
fn source_tree(root: &Path) {
    let big: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    fs::create_dir_all(root.join("a/b/c/d")).unwrap();
    fs::create_dir_all(root.join("empty dir")).unwrap();
    fs::create_dir_all(root.join("日本語/données")).unwrap();
    fs::write(root.join("a/b/c/d/deep.txt"), b"deep\n").unwrap();
    fs::write(root.join("a/empty"), b"").unwrap();
    fs::write(root.join("big.bin"), &big).unwrap();
    fs::write(root.join("日本語/données/été.txt"), "ça va\n").unwrap();
    fs::write(root.join("a/same1"), b"same contents\n").unwrap();
    fs::write(root.join("a/b/same2"), b"same contents\n").unwrap();
    fs::set_permissions(root.join("a/same1"), fs::Permissions::from_mode(0o751)).unwrap();
    symlink("b/c/d/deep.txt", root.join("a/rel")).unwrap();
    symlink("/etc/passwd", root.join("abs")).unwrap();
    symlink("nowhere", root.join("dangling")).unwrap();
    symlink("a/b", root.join("dirlink")).unwrap();
    // Enough entries for the manifest to need a Merkle tree.
    fs::create_dir(root.join("many")).unwrap();
    for i in 0..200 {
        fs::write(root.join(format!("many/file-{i:03}")), b"").unwrap();
    }
    let fifo = std::ffi::CString::new(root.join("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0, "mkfifo");
}

struct Image {
    dir: tempfile::TempDir,
    src: PathBuf,
    dest: PathBuf,
    published: Published,
}

/// A verifier with nothing cached.
fn fresh() -> Arc<Verifier> {
    Verifier::new(ReadOptions::default())
}

impl Image {
    fn new(params: &MerkleTreeParams) -> Image {
        let dir = tempfile::tempdir().unwrap();
        let (src, dest) = (dir.path().join("src"), dir.path().join("image"));
        source_tree(&src);
        let published = publish(&src, &dest, params).unwrap();
        Image {
            dir,
            src,
            dest,
            published,
        }
    }

    fn trusted(&self) -> ManifestTrust {
        let digest = format!("{}:{}", self.published.algorithm, self.published.digest);
        ManifestTrust::Digest(digest.parse().unwrap())
    }

    fn manifest(&self) -> verityfs::Result<Manifest> {
        let source = Arc::new(File::open(self.dest.join(MANIFEST_NAME)).unwrap());
        open_manifest(&fresh(), source, &self.trusted())
    }

    fn open(&self, manifest: &Manifest, path: &str) -> verityfs::Result<VerityFile> {
        let object = regular(manifest, path);
        let alg = manifest.algorithm();
        let source = Arc::new(File::open(self.dest.join(object.path(alg))).unwrap());
        open_object(&fresh(), alg, object, source, path.as_ref())
    }
}

fn regular<'a>(manifest: &'a Manifest, path: &str) -> &'a verityfs::image::FileObject {
    let index = manifest
        .lookup(path.as_bytes())
        .unwrap_or_else(|| panic!("{path} missing"));
    match &manifest.entries()[index as usize].kind {
        EntryKind::Regular(object) => object,
        other => panic!("{path} is {other:?}"),
    }
}

fn read_all(file: &VerityFile) -> verityfs::Result<Vec<u8>> {
    // Odd-sized reads: unaligned ones too.
    read_in(file, 100_003)
}

/// The whole file, in reads of `chunk` bytes.
fn read_in(file: &VerityFile, chunk: usize) -> verityfs::Result<Vec<u8>> {
    let mut out = vec![0u8; file.data_size() as usize];
    let mut done = 0;
    while done < out.len() {
        let end = (done + chunk).min(out.len());
        done += file.read_at(&mut out[done..end], done as u64)?;
    }
    Ok(out)
}

/// The relative paths of everything under `root`, without following
/// symlinks.
fn walk(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(root.join(rel)).unwrap() {
        let rel = rel.join(entry.unwrap().file_name());
        out.push(rel.clone());
        if fs::symlink_metadata(root.join(&rel)).unwrap().is_dir() {
            walk(root, &rel, out);
        }
    }
}

#[test]
fn round_trip_of_a_tree() {
    let image = Image::new(&MerkleTreeParams::default());
    let manifest = image.manifest().unwrap();
    assert_eq!(image.published.skipped, vec![image.src.join("fifo")]);
    let mut paths = Vec::new();
    walk(&image.src, Path::new(""), &mut paths);
    paths.retain(|p| p != Path::new("fifo"));
    assert_eq!(
        manifest.entries().len(),
        paths.len() + 1,
        "every file and the root"
    );
    for rel in &paths {
        check_entry(&image, &manifest, rel);
    }
    // 206 regular files, 5 distinct contents (all of many/ is empty).
    let objects = fs::read_dir(image.dest.join("objects")).unwrap().count();
    assert_eq!((objects, image.published.objects_written), (5, 5));
    let root = &manifest.entries()[0];
    assert_eq!(root.kind, EntryKind::Directory);
    assert_eq!(manifest.lookup(b""), Some(0));
    assert_eq!(manifest.lookup(b"a/nothing"), None);
    assert_eq!(
        manifest.lookup(b"dirlink/c"),
        None,
        "symlinks are not followed"
    );
}

/// The entry of `rel` has the source file's type, mode, time, size,
/// contents or target.
fn check_entry(image: &Image, manifest: &Manifest, rel: &Path) {
    let path = image.src.join(rel);
    let md = fs::symlink_metadata(&path).unwrap();
    let index = manifest.lookup(rel.as_os_str().as_bytes()).unwrap();
    let entry: &Entry = &manifest.entries()[index as usize];
    assert_eq!(entry.name, rel.file_name().unwrap().as_bytes());
    assert_eq!(u32::from(entry.mode), md.mode() & 0o7777, "{rel:?}");
    assert_eq!(entry.mtime, (md.mtime(), md.mtime_nsec() as u32), "{rel:?}");
    match &entry.kind {
        EntryKind::Directory => assert!(md.is_dir()),
        EntryKind::Symlink(target) => {
            assert_eq!(target, fs::read_link(&path).unwrap().as_os_str().as_bytes())
        }
        EntryKind::Regular(object) => {
            assert_eq!(object.location.data_size, md.len());
            let file = image.open(manifest, rel.to_str().unwrap()).unwrap();
            assert_eq!(
                read_all(&file).unwrap(),
                fs::read(&path).unwrap(),
                "{rel:?}"
            );
        }
    }
}

/// `fsverity digest` of `path` with `params`, as `ALG:HEX`.
fn fsverity_digest(path: &Path, args: &[&str]) -> String {
    let out = Command::new("fsverity")
        .arg("digest")
        .args(args)
        .arg(path)
        .output()
        .expect("the fsverity program (fsverity-utils) must be installed for this test");
    assert!(out.status.success(), "fsverity digest {path:?}: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    text.split_whitespace().next().unwrap().to_owned()
}

fn digests_match_fsverity(params: &MerkleTreeParams, args: &[&str]) {
    let image = Image::new(params);
    let manifest = image.manifest().unwrap();
    let alg = params.hash_algorithm();
    for rel in [
        "big.bin",
        "a/empty",
        "a/same1",
        "a/b/same2",
        "日本語/données/été.txt",
    ] {
        let object = regular(&manifest, rel);
        let want = fsverity_digest(&image.src.join(rel), args);
        assert_eq!(format!("{alg}:{}", object.digest), want, "{rel}");
        let name = image.dest.join(object.path(alg));
        assert!(name.ends_with(want.replace(':', "-")), "{name:?}");
    }
    // The trusted digest is the manifest's data's fs-verity digest.
    let manifest_data = image.dir.path().join("manifest.data");
    fs::write(&manifest_data, manifest.encode()).unwrap();
    let want = fsverity_digest(&manifest_data, args);
    assert_eq!(format!("{alg}:{}", image.published.digest), want);
}

#[test]
fn digests_are_those_of_fsverity_digest() {
    digests_match_fsverity(&MerkleTreeParams::default(), &[]);
    let params = MerkleTreeParams::new(HashAlgorithm::Sha512, 1024, b"\x01\x02salt").unwrap();
    let args = [
        "--hash-alg=sha512",
        "--block-size=1024",
        "--salt=010273616c74",
    ];
    digests_match_fsverity(&params, &args);
}

fn assert_corrupted<T>(result: verityfs::Result<T>, what: &str) {
    match result {
        Err(Error::Corrupted(c)) => eprintln!("{what}: {c}"),
        Err(e) => panic!("{what}: {e} instead of a corruption"),
        Ok(_) => panic!("{what}: accepted"),
    }
}

#[test]
fn tampered_manifest_is_refused() {
    let image = Image::new(&MerkleTreeParams::default());
    let path = image.dest.join(MANIFEST_NAME);
    let location = {
        let file = File::open(&path).unwrap();
        let mut trailer = [0u8; 48];
        file.read_exact_at(&mut trailer, file.metadata().unwrap().len() - 48)
            .unwrap();
        verityfs::Location::decode(&trailer).unwrap()
    };
    assert!(location.tree_size > 0, "the manifest has a tree");
    for (what, pos) in [
        ("manifest data", location.data_size / 2),
        ("manifest tree", location.tree_pos + 5),
        ("manifest root hash", location.desc_pos + 20),
    ] {
        common::flip(&path, pos);
        assert_corrupted(image.manifest(), what);
        common::flip(&path, pos);
    }
    image.manifest().unwrap();
    let wrong: ExpectedDigest = format!("sha256:{}", "00".repeat(32)).parse().unwrap();
    let source = Arc::new(File::open(&path).unwrap());
    let wrong = ManifestTrust::Digest(wrong);
    assert_corrupted(open_manifest(&fresh(), source, &wrong), "wrong digest");
}

#[test]
fn tampered_object_is_refused() {
    let image = Image::new(&MerkleTreeParams::default());
    let manifest = image.manifest().unwrap();
    let object = *regular(&manifest, "big.bin");
    let path = image.dest.join(object.path(manifest.algorithm()));
    let l = object.location;
    for (what, pos) in [
        ("object data", 2_000_000),
        ("object tree", l.tree_pos + l.tree_size - 10),
        ("object root hash", l.desc_pos + 40),
    ] {
        common::flip(&path, pos);
        assert_corrupted(
            image.open(&manifest, "big.bin").and_then(|f| read_all(&f)),
            what,
        );
        common::flip(&path, pos);
    }
    let file = image.open(&manifest, "big.bin").unwrap();
    assert_eq!(
        read_all(&file).unwrap(),
        fs::read(image.src.join("big.bin")).unwrap()
    );
    // Another file's object in place of this one's.
    let other = regular(&manifest, "a/same1");
    fs::copy(image.dest.join(other.path(manifest.algorithm())), &path).unwrap();
    let err = image.open(&manifest, "big.bin").err().expect("refused");
    assert_eq!(err.errno(), libc::EIO, "{err}");
}

/// A descriptor made invalid (its version byte), in an object or in a
/// manifest trusted by its digest: not a descriptor with the trusted
/// digest, so tampering (`EIO`), not the `EINVAL` of a local verity file's
/// invalid descriptor.
#[test]
fn a_garbled_descriptor_is_tampering() {
    let image = Image::new(&MerkleTreeParams::default());
    let manifest = image.manifest().unwrap();
    let object = *regular(&manifest, "big.bin");
    let path = image.dest.join(object.path(manifest.algorithm()));
    common::flip(&path, object.location.desc_pos);
    let tampered = |result: verityfs::Result<_>, what: &str| match result {
        Err(e @ Error::DescriptorTampered { .. }) => assert_eq!(e.errno(), libc::EIO, "{what}"),
        Err(e) => panic!("{what}: {e} instead of tampering"),
        Ok(_) => panic!("{what}: accepted"),
    };
    tampered(image.open(&manifest, "big.bin").map(drop), "object");
    let path = image.dest.join(MANIFEST_NAME);
    let len = fs::metadata(&path).unwrap().len();
    // The manifest's descriptor ends where its 48-byte record begins.
    common::flip(&path, len - 48 - 256);
    tampered(image.manifest().map(drop), "manifest");
}

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

#[test]
fn publish_refuses_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let params = MerkleTreeParams::default();
    fs::create_dir(dir.path().join("real")).unwrap();
    symlink("real", dir.path().join("link")).unwrap();
    let out = dir.path().join("out");
    let err = publish(&dir.path().join("link"), &out, &params).unwrap_err();
    assert_eq!(err.errno(), libc::EINVAL, "a symlinked source: {err}");
    assert!(!out.exists(), "nothing created");
    let inside = dir.path().join("real/image");
    let err = publish(&dir.path().join("real"), &inside, &params).unwrap_err();
    assert_eq!(
        err.errno(),
        libc::EINVAL,
        "the destination inside the source: {err}"
    );
    let err = publish(&dir.path().join("missing"), &out, &params).unwrap_err();
    assert_eq!(err.errno(), libc::ENOENT);
    assert!(err.to_string().contains("missing"), "names the path: {err}");
}

/// A manifest written by hand from the tables of `docs/IMAGE.md` decodes to
/// what the tables say, and encodes back to the same bytes.
#[test]
fn documented_encoding() {
    let entry = |parent: u32, kind: u8, name: &str, mode: u16, mtime: (i64, u32)| {
        let mut b = parent.to_le_bytes().to_vec();
        b.extend_from_slice(&[kind, name.len() as u8]);
        b.extend_from_slice(&mode.to_le_bytes());
        b.extend_from_slice(&mtime.0.to_le_bytes());
        b.extend_from_slice(&mtime.1.to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b
    };
    let mut bytes = b"VFSM\x01\x01\0\0".to_vec();
    bytes.extend_from_slice(&4u32.to_le_bytes());
    bytes.extend_from_slice(&[0; 4]);
    bytes.extend(entry(0, 1, "", 0o755, (1_700_000_000, 7)));
    bytes.extend(entry(0, 2, "file", 0o4644, (-1, 999_999_999)));
    bytes.extend_from_slice(&5000u64.to_le_bytes());
    bytes.extend_from_slice(&4096u64.to_le_bytes());
    bytes.extend_from_slice(&256u32.to_le_bytes());
    bytes.extend_from_slice(&[0; 4]);
    bytes.extend_from_slice(&[0xab; 32]);
    bytes.extend_from_slice(b"file");
    bytes.extend(entry(0, 3, "link", 0o777, (0, 0)));
    bytes.extend_from_slice(&2u16.to_le_bytes());
    bytes.extend_from_slice(b"..");
    bytes.extend_from_slice(b"link");
    bytes.extend(entry(0, 1, "sub", 0o700, (0, 0)));
    bytes.extend_from_slice(b"sub");

    let m = Manifest::decode(&bytes).unwrap();
    assert_eq!(m.algorithm(), HashAlgorithm::Sha256);
    assert_eq!(m.encode(), bytes);
    let e = m.entries();
    assert_eq!((e[0].mode, e[0].mtime), (0o755, (1_700_000_000, 7)));
    assert_eq!(
        (&e[1].name[..], e[1].mode, e[1].mtime),
        (&b"file"[..], 0o4644, (-1, 999_999_999))
    );
    let EntryKind::Regular(object) = &e[1].kind else {
        panic!("{:?}", e[1].kind)
    };
    assert_eq!(object.digest.as_bytes(), &[0xab; 32]);
    let l = object.location;
    assert_eq!((l.data_size, l.tree_pos, l.tree_size), (5000, 65536, 4096));
    assert_eq!((l.desc_pos, l.desc_size), (65536 + 4096, 256));
    assert_eq!(
        object.path(HashAlgorithm::Sha256),
        format!("objects/sha256-{}", "ab".repeat(32))
    );
    assert_eq!(e[2].kind, EntryKind::Symlink(b"..".to_vec()));
    assert_eq!(
        (e[3].kind.clone(), m.lookup(b"/sub/")),
        (EntryKind::Directory, Some(3))
    );
    assert_eq!(m.children(0), 1..4);
    assert_eq!(m.children(3), 4..4);
    assert_eq!(m.lookup(b"link/x"), None, "symlinks are not followed");
}

#[test]
fn publishing_again_replaces_damaged_objects() {
    let image = Image::new(&MerkleTreeParams::default());
    let clean = image.dir.path().join("clean");
    publish(&image.src, &clean, &MerkleTreeParams::default()).unwrap();
    let mut names: Vec<_> = fs::read_dir(image.dest.join("objects"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    // One object with a byte changed, one cut short, one a link elsewhere,
    // one a socket.
    let mut flipped = fs::read(&names[0]).unwrap();
    flipped[0] ^= 1;
    fs::write(&names[0], flipped).unwrap();
    let cut = fs::read(&names[1]).unwrap();
    fs::write(&names[1], &cut[..cut.len() / 2]).unwrap();
    fs::remove_file(&names[2]).unwrap();
    std::os::unix::fs::symlink(clean.join("manifest"), &names[2]).unwrap();
    fs::remove_file(&names[3]).unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(&names[3]).unwrap();
    let again = publish(&image.src, &image.dest, &MerkleTreeParams::default()).unwrap();
    assert_eq!(
        again.objects_written, 4,
        "the damaged objects were replaced"
    );
    for name in &names {
        let fresh = clean.join("objects").join(name.file_name().unwrap());
        let meta = fs::symlink_metadata(name).unwrap();
        assert!(meta.is_file(), "{}", name.display());
        assert_eq!(fs::read(name).unwrap(), fs::read(fresh).unwrap());
    }
    // A directory there is not removed: the publish fails, naming it.
    fs::remove_file(&names[4]).unwrap();
    fs::create_dir(&names[4]).unwrap();
    let e = publish(&image.src, &image.dest, &MerkleTreeParams::default()).unwrap_err();
    assert!(e.to_string().contains(&*names[4].to_string_lossy()), "{e}");
}

#[test]
fn publishing_again_gives_the_same_digest_and_shares_objects() {
    let image = Image::new(&MerkleTreeParams::default());
    let again = publish(&image.src, &image.dest, &MerkleTreeParams::default()).unwrap();
    assert_eq!(
        again.digest, image.published.digest,
        "the encoding is canonical"
    );
    assert_eq!(again.objects_written, 0, "every object was there");
    let elsewhere = image.dir.path().join("elsewhere");
    let third = publish(&image.src, &elsewhere, &MerkleTreeParams::default()).unwrap();
    assert_eq!((third.digest, third.objects_written), (again.digest, 5));
    let leftovers: Vec<_> = fs::read_dir(image.dest.join("objects"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.as_bytes().starts_with(b".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

/// A source kept in memory, recording the requests the read path makes:
/// what a remote source sees.
#[derive(Default)]
struct Recorded {
    bytes: Vec<u8>,
    reads: std::sync::Mutex<Vec<(u64, usize)>>,
    prefetches: std::sync::Mutex<Vec<(u64, u64)>>,
}

impl verityfs::Source for Recorded {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.reads.lock().unwrap().push((offset, buf.len()));
        let end = offset as usize + buf.len();
        let src = self.bytes.get(offset as usize..end);
        buf.copy_from_slice(src.ok_or(std::io::ErrorKind::UnexpectedEof)?);
        Ok(())
    }

    fn prefetch(&self, offset: u64, len: u64) {
        self.prefetches.lock().unwrap().push((offset, len));
    }

    fn size(&self) -> std::io::Result<u64> {
        Ok(self.bytes.len() as u64)
    }
}

#[test]
fn an_object_read_through_another_source() {
    let image = Image::new(&MerkleTreeParams::default());
    let manifest = image.manifest().unwrap();
    let object = regular(&manifest, "big.bin");
    let bytes = fs::read(image.dest.join(object.path(manifest.algorithm()))).unwrap();
    let source = Arc::new(Recorded {
        bytes,
        ..Default::default()
    });
    let file = open_object(
        &fresh(),
        manifest.algorithm(),
        object,
        source.clone(),
        "big".as_ref(),
    )
    .unwrap();
    // Aligned reads, as FUSE sends them.
    let data = read_in(&file, 128 << 10).unwrap();
    assert_eq!(data, fs::read(image.src.join("big.bin")).unwrap());
    let l = object.location;
    let reads = source.reads.lock().unwrap().clone();
    // The descriptor, then data and tree: each byte read once.
    assert_eq!(reads[0], (l.desc_pos, 256));
    let tree_bytes: usize = reads
        .iter()
        .filter(|r| r.0 >= l.tree_pos && r.0 < l.desc_pos)
        .map(|r| r.1)
        .sum();
    assert_eq!(tree_bytes as u64, l.tree_size, "{reads:?}");
    let data_bytes: usize = reads
        .iter()
        .filter(|r| r.0 < l.data_size)
        .map(|r| r.1)
        .sum();
    assert_eq!(data_bytes as u64, l.data_size);
    // Readahead asks for metadata only: tree ranges, and at open the tree
    // with the descriptor.
    let prefetches = source.prefetches.lock().unwrap().clone();
    assert!(!prefetches.is_empty());
    let metadata_end = l.desc_pos + u64::from(l.desc_size);
    for (offset, len) in prefetches {
        assert!(
            offset >= l.tree_pos && offset + len <= metadata_end,
            "{offset}+{len}"
        );
    }
}

#[test]
fn a_directory_store_opens_only_regular_files_beneath_it() {
    use verityfs::image::{DirStore, Store};
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside");
    fs::write(&outside, b"secret").unwrap();
    let image = dir.path().join("image");
    fs::create_dir_all(image.join("objects")).unwrap();
    fs::write(image.join("objects/plain"), b"object").unwrap();
    symlink(&outside, image.join("objects/link")).unwrap();
    symlink(dir.path(), image.join("up")).unwrap();
    let fifo = image.join("objects/fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let store = DirStore::new(&image).unwrap();
    assert!(store.open("objects/plain").is_ok());
    for refused in [
        "objects/link",
        "up/outside",
        "../outside",
        "objects/fifo",
        "objects",
    ] {
        // A FIFO would block the open forever: this returns at once.
        assert!(store.open(refused).is_err(), "{refused}");
    }
}

/// A key and self-signed certificate made by `openssl req` in `dir`.
fn key_and_cert(dir: &Path, name: &str) -> (SigningKey, Certificate) {
    let (key, crt) = (
        dir.join(format!("{name}.key")),
        dir.join(format!("{name}.crt")),
    );
    let out = Command::new("openssl")
        .args([
            "req", "-x509", "-nodes", "-days", "30", "-newkey", "rsa:2048",
        ])
        .args(["-subj", &format!("/CN={name}"), "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .output()
        .expect("the openssl tool is needed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = SigningKey::from_pem(&fs::read(key).unwrap()).unwrap();
    (key, Certificate::from_pem(&fs::read(crt).unwrap()).unwrap())
}

#[test]
fn a_signed_manifest_is_trusted_by_its_certificate_only() {
    let dir = tempfile::tempdir().unwrap();
    let (key, cert) = key_and_cert(dir.path(), "publisher");
    let (_, other) = key_and_cert(dir.path(), "other");
    let src = dir.path().join("src");
    source_tree(&src);
    let params = MerkleTreeParams::default();
    let sign = |alg: HashAlgorithm, digest: &Digest| {
        sign_digest_with(alg, digest, &key, &cert).map_err(std::io::Error::other)
    };
    let signed_dest = dir.path().join("signed");
    let signed = publish_signed(&src, &signed_dest, &params, Some(&sign)).unwrap();
    let unsigned = publish(&src, &dir.path().join("unsigned"), &params).unwrap();
    assert_eq!(
        signed.digest, unsigned.digest,
        "the digest ignores the signature"
    );
    let open = |dest: &str, trust: ManifestTrust| {
        let source = Arc::new(File::open(dir.path().join(dest).join(MANIFEST_NAME)).unwrap());
        open_manifest(&fresh(), source, &trust)
    };
    let by = |certs: Vec<Certificate>| ManifestTrust::Signed(certs);
    let manifest = open("signed", by(vec![other.clone(), cert.clone()])).unwrap();
    assert_eq!(manifest.entries().len(), unsigned.entries);
    let digest = format!("sha256:{}", signed.digest).parse().unwrap();
    open("signed", ManifestTrust::Digest(digest)).expect("a digest trusts it too");
    let untrusted = open("signed", by(vec![other])).err().unwrap();
    assert!(
        matches!(untrusted, Error::Signature(SignatureError::KeyNotTrusted)),
        "{untrusted:?}"
    );
    let missing = open("unsigned", by(vec![cert])).err().unwrap();
    assert!(matches!(missing, Error::NoSignature), "{missing:?}");
}
