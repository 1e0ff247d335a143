//! Known-answer tests: digests published by others, each test naming its
//! source, so that the library is checked against the kernel's format
//! (`Documentation/filesystems/fsverity.rst` in Linux) and not only against
//! itself. Every value here was also reproduced with fsverity-utils v1.5's
//! `fsverity digest` (Debian's `fsverity` package; the tree blocks and
//! descriptor with its `--out-merkle-tree` and `--out-descriptor`).

use verityfs::{build_merkle_tree, DiscardTree, HashAlgorithm, MerkleTreeParams};

/// fsverity-utils' test pattern: byte i = (i % 11) + (i % 439) + (i % 1103).
fn pattern(size: usize) -> Vec<u8> {
    (0..size)
        .map(|i| ((i % 11) + (i % 439) + (i % 1103)) as u8)
        .collect()
}

fn digest(alg: HashAlgorithm, block_size: u64, salt: &[u8], data: &[u8]) -> String {
    let params = MerkleTreeParams::new(alg, block_size, salt).unwrap();
    let (descriptor, _) =
        build_merkle_tree(&params, data.len() as u64, data, DiscardTree, &mut |_| {
            Ok(())
        })
        .unwrap();
    descriptor.file_digest().to_hex()
}

fn tree(alg: HashAlgorithm, block_size: u64, data: &[u8]) -> (Vec<u8>, [u8; 256]) {
    let params = MerkleTreeParams::new(alg, block_size, b"").unwrap();
    let (descriptor, tree) = build_merkle_tree(
        &params,
        data.len() as u64,
        data,
        Vec::new(),
        &mut |_| Ok(()),
    )
    .unwrap();
    (tree, descriptor.to_unsigned_bytes())
}

use HashAlgorithm::{Sha256, Sha512};

/// fsverity-utils' `programs/test_compute_digest.c` (`test_compute_digest()`):
/// the [`pattern`] input, every block size and both algorithms.
#[test]
fn fsverity_utils_test_compute_digest() {
    let salt32 = b"0123456789:;<=>?@ABCDEFGHIJKLMNO";
    let cases: &[(HashAlgorithm, u64, &[u8], usize, &str)] = &[
        (Sha256, 4096, b"", 1000000, "48df0c462329cd879661bd05b39aa81b05cc16afd27a7196a559da83531d39d9"),
        (Sha256, 4096, b"", 100000, "f2096a36c5cdca4fa33ee8852833150bb324992e5417a9d571f1bffff73b9efc"),
        (Sha256, 4096, b"", 4096, "6ac39979016e3ddf3d39fff6cb984f7c118acdf1852919f5c100c4b142c1818e"),
        (Sha256, 4096, b"", 1, "b803429503d95915829b29fdbc8bbad142f3abfd11b1cadf5526582e685c0551"),
        (Sha256, 4096, b"", 0, "3d248ca542a24fc62d1c43b916eae5016878e2533c88238480b26128a1f1af95"),
        (Sha256, 4096, b"abcd", 1000000, "917900b0d299454aa304d5debc6f39e4af7b5abe33bdbc568d5d8f1e5c4d8652"),
        (Sha256, 4096, salt32, 1000000, "bc2d70324c048c220a2cb190832140863eb268e680427939e5d467bea5ec5ad9"),
        (Sha256, 1024, b"", 1000000, "e9df927c14fcb961d5f51c666d8ae4c14fe4ff98a374c733e898d00c9e74a8e3"),
        (Sha256, 512, b"", 1000000, "0393ee3dfd4a28966e2af4e07cfa5b032c30da5bb8e8ef63b9a55bf963262334"),
        (Sha256, 65536, b"", 1000000, "f3b6418f26d4d0e74728193bae76f15cb4bb2ce9777448d76bd8138b69ec61c2"),
        (Sha512, 4096, b"abcd", 1000000, "8425c6d0c94f84ed904c12936845fbb7af9953753789712dcc3be142db3d4b6b47a399ad52aa609256ce29a960bf4bb0e595ec386ca58c06519d546dc5b197bb"),
    ];
    for &(alg, bs, salt, size, want) in cases {
        assert_eq!(
            digest(alg, bs, salt, &pattern(size)),
            want,
            "{alg} bs={bs} size={size}"
        );
    }
}

/// fsverity-utils' `programs/test_compute_digest.c`
/// (`test_metadata_callbacks()`): the tree blocks and descriptor of 100000
/// zero bytes with 1 KiB blocks.
#[test]
fn fsverity_utils_metadata_callbacks() {
    let (tree, descriptor) = tree(Sha256, 1024, &[0u8; 100000]);
    assert_eq!(tree.len(), 5120);
    let block_hash = |i: usize| Sha256.hash(&tree[i * 1024..(i + 1) * 1024]).to_hex();
    assert_eq!(
        block_hash(0),
        "68c538e11958d65d68b6fe8e9fb8ccabecfd928b01d06344e223ed41ddc4544a"
    );
    for i in 1..4 {
        assert_eq!(
            block_hash(i),
            "f789baab53859faf36d6d75d1042064294202d6e13e7716f394fba434ccc4986"
        );
    }
    assert_eq!(
        block_hash(4),
        "00fed03c5d6eab213143f3d96a5ca31c2b89f5684e6c8e07873e5e976517b48f"
    );
    assert_eq!(
        Sha256.hash(&descriptor).to_hex(),
        "09cbbaeed2a04c2da242c10e1568d96f358a16aa1ebe8cf0286120c13c9366d1"
    );
}

/// The salt of generic/575's largest file.
const GENERIC_575_SALT: &str = "f3c93fa6fb828c0e1587e5714ecf6f56";

/// xfstests' `tests/generic/575` (and its `.out`): digests the kernel
/// computed for files of zero bytes, 4 KiB blocks.
#[test]
fn xfstests_generic_575() {
    let salt = hex::decode(GENERIC_575_SALT).unwrap();
    let cases: &[(usize, &[u8], &str, &str)] = &[
        (0, b"", "3d248ca542a24fc62d1c43b916eae5016878e2533c88238480b26128a1f1af95", "ccf9e5aea1c2a64efa2f2354a6024b90dffde6bbc017825045dce374474e13d10adb9dadcc6ca8e17a3c075fbd31336e8f266ae6fa93a6c3bed66f9e784e5abf"),
        (4096, b"", "babc284ee4ffe7f449377fbf6692715b43aec7bc39c094a95878904d34bac97e", "928922686c4caf32175f5236a7f964e9925d10a74dc6d8344a8bd08b23c228ff5792573987d7895f628f39c4f4ebe39a7367d7aeb16aaa0cd324ac1d53664e61"),
        (65536, b"", "011e3f2b1dc89b75d78cddcc2a1b85cd8a64b2883e5f20f277ae4c0617e0404f", "eab7224ce374a0a4babcb2db25e24836247f38b87806ad9be9e5ba4daac2f5b814fc0cbdfd9f1f8499b3c9a6c1b38fe08974cce49883ab4ccd04462fd2f9507f"),
        (100000000, &salt, "9d33cab743468fcbe4edab91a275b30dd543c12dd5e6ce6f2f737f66a1558f06", "f7083a38644880d25539488313e9e5b41a4d431a0e383945129ad2c36e3c1d0f28928a424641bb1363c12b6e770578102566acea73baf1ce8ee15336f5ba2446"),
    ];
    for &(size, salt, sha256, sha512) in cases {
        let zeroes = vec![0u8; size];
        assert_eq!(
            digest(Sha256, 4096, salt, &zeroes),
            sha256,
            "sha256 size={size}"
        );
        assert_eq!(
            digest(Sha512, 4096, salt, &zeroes),
            sha512,
            "sha512 size={size}"
        );
    }
}

/// generic/575's files with 1 KiB blocks, which that test does not cover:
/// `head -c N /dev/zero >f; fsverity digest --block-size=1024 [--salt=...] f`
/// with fsverity-utils v1.5.
#[test]
fn generic_575_files_with_1k_blocks() {
    let salt = hex::decode(GENERIC_575_SALT).unwrap();
    let cases: &[(usize, &[u8], &str)] = &[
        (
            0,
            b"",
            "f2cca36b9b1b7f07814e4284b10121809133e7cb9c4528c8f6846e85fc624ffa",
        ),
        (
            4096,
            b"",
            "ea08590a4fe9c3d6c9dafe0eedacd9dffff8f24e24f1865ee3af132a495ab087",
        ),
        (
            65536,
            b"",
            "527496288d703686e31092f5cca7e1306b2467f00b247ad01056ee5ec35a4bb9",
        ),
        (
            100000000,
            &salt,
            "087818b23312acb15dff9ff6e2b4f601406d08bb36013542444cc15248f47016",
        ),
    ];
    for &(size, salt, want) in cases {
        assert_eq!(
            digest(Sha256, 1024, salt, &vec![0u8; size]),
            want,
            "1k size={size}"
        );
    }
}

/// N bytes of `A` (0x41), 4 KiB blocks, no salt: the vectors of
/// github.com/moreati/fsverity-hash (`tests/data/fsverity_digest.txt` and
/// `tests/data/sha512_bs4096_digest.txt`, made with `fsverity digest`), around
/// the block and tree-level boundaries. Then `echo lorem ipsum >f`, whose
/// digest a puzzlefs bug report shows from both `fsverity digest` and the
/// kernel's `fsverity measure` on ext4
/// (github.com/project-machine/puzzlefs/issues/69).
#[test]
fn repeated_a_vectors() {
    let cases: &[(usize, &str)] = &[
        (
            1,
            "9845e616f7d2f7a1cd6742f0546a36d2e74d4eb8ae7d9bdc0b0df982c27861b7",
        ),
        (
            4095,
            "aab040052277ce2baa6de148f1b3c8798de72f760d019427f44ce7caac6a69ef",
        ),
        (
            4097,
            "7319937c445f61df1a8f310eb4d6da157618d80713972a78d70a7528fc1a6f32",
        ),
        (
            524288,
            "f5c2b9ded1595acfe8a996795264d488dd6140531f6a01f8f8086a83fd835935",
        ),
        (
            524289,
            "a7abb76568871169a79104d00679fae6521dfdb2a2648e380c02b10e96e217ff",
        ),
        (
            1234567,
            "04b74498f0fafcd91622f0b218f3f1a024221e7ccb1732ea180cd4833808edd6",
        ),
        (
            67108865,
            "d0d2d7311c25c6d121011a569274bec0929afe1ca56543cb1235d5056efc4f7b",
        ),
    ];
    for &(size, want) in cases {
        assert_eq!(
            digest(Sha256, 4096, b"", &vec![b'A'; size]),
            want,
            "size={size}"
        );
    }
    assert_eq!(
        digest(Sha512, 4096, b"", &vec![b'A'; 524289]),
        "e957e494d3c66366a8a13f50a5a2cbb8e457eb88337ea6da3c750b9c06e20cff073e3f60bb152c4f314c9b093506c666ec09ccf320f2c8723685a477de02ea38"
    );
    assert_eq!(
        digest(Sha256, 4096, b"", b"lorem ipsum\n"),
        "fda0e2d973b5c81e4a8ccc43a0bb13cbc9b5da8d83c4ff4416f6860ea20df0d6"
    );
}
