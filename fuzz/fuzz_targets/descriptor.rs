//! Arbitrary bytes as a stored descriptor (`Descriptor::parse`): no panic;
//! what parses re-encodes to exactly the bytes it came from, re-parses to
//! itself, and has the file digest a hand-written encoder and `sha2` give.
//! The parsed (untrusted) sizes then go through the tree geometry and the
//! layout, which must not panic or allocate in proportion to them.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use verityfs::descriptor::{Descriptor, DESCRIPTOR_SIZE, MAX_DESCRIPTOR_SIZE};
use verityfs::layout::Location;
use verityfs::TreeGeometry;

fuzz_target!(|data: &[u8]| {
    let (parsed, allocated) = common::allocated_by(|| Descriptor::parse(data));
    assert_eq!(allocated, 0, "parsing allocated");
    let Ok((desc, sig)) = parsed else {
        assert!(
            data.len() < DESCRIPTOR_SIZE
                || data.len() > MAX_DESCRIPTOR_SIZE
                || data[0] != 1
                || data[1] == 0
                || data[1] > 2
                || data[3] > 32
                || data[112..256].iter().any(|&b| b != 0)
                || common::le32(data, 4) as usize > data.len() - DESCRIPTOR_SIZE
                || data[2] < 6
                || data[2] > 31
                || data[2] < 7 && data[1] == 2
                || parses_only_with_tail(data),
            "a well-formed descriptor was rejected"
        );
        return;
    };

    // Re-encoding gives back the input prefix exactly.
    let stored_len = DESCRIPTOR_SIZE + desc.sig_size() as usize;
    assert!(stored_len <= data.len() && data.len() <= MAX_DESCRIPTOR_SIZE);
    assert_eq!(sig, &data[DESCRIPTOR_SIZE..stored_len]);
    let mut encoded = desc.to_bytes().to_vec();
    encoded.extend_from_slice(sig);
    assert_eq!(encoded, &data[..stored_len]);
    assert_eq!(Descriptor::parse(&encoded).unwrap(), (desc, sig));

    // The accessors agree with the raw fields.
    let params = desc.params();
    let alg = params.hash_algorithm();
    assert_eq!(alg.id(), data[1]);
    assert_eq!(params.log_block_size(), data[2]);
    assert_eq!(params.block_size(), 1usize << data[2]);
    assert_eq!(params.salt().as_bytes(), &data[80..80 + data[3] as usize]);
    assert_eq!(desc.data_size(), common::le64(data, 8));
    assert_eq!(
        desc.root_hash().as_bytes(),
        &data[16..16 + common::digest_size(alg)]
    );

    // The file digest: the hash of the descriptor with sig_size zeroed.
    let mut unsigned = data[..DESCRIPTOR_SIZE].to_vec();
    unsigned[4..8].fill(0);
    assert_eq!(desc.to_unsigned_bytes()[..], unsigned[..]);
    assert_eq!(
        unsigned,
        common::descriptor_bytes(
            alg,
            data[2],
            params.salt().as_bytes(),
            desc.data_size(),
            desc.root_hash().as_bytes(),
        )
    );
    let (digest, allocated) = common::allocated_by(|| desc.file_digest());
    assert!(allocated < 4096, "file_digest allocated {allocated} bytes");
    assert_eq!(digest.as_bytes(), common::hash(alg, &unsigned));

    // What a reader does next with these untrusted numbers.
    let ((), allocated) = common::allocated_by(|| {
        let geometry = TreeGeometry::new(params, desc.data_size());
        let _ = geometry.check_kernel_limits();
        let _ = params.check_kernel_limits();
        let _ = Location::new(desc.data_size(), geometry.tree_size(), stored_len as u32);
    });
    assert!(allocated < 4096, "geometry allocated {allocated} bytes");
});

/// True if the root hash or salt field has non-zero bytes past the digest or
/// salt: the one remaining reason to reject a descriptor.
fn parses_only_with_tail(data: &[u8]) -> bool {
    let digest_size = if data[1] == 1 { 32 } else { 64 };
    data[16 + digest_size..80].iter().any(|&b| b != 0)
        || data[80 + data[3] as usize..112].iter().any(|&b| b != 0)
}
