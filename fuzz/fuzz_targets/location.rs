//! Arbitrary bytes as the layout's extended attribute records
//! (`Location::decode`, `EnablingRecord::decode`): no panic; what decodes
//! encodes back to the same bytes and is a location `Location::new` would
//! make. The first 20 bytes also go to `Location::new` as (data size, tree
//! size, descriptor size): no panic, and what it accepts decodes to itself.

#![no_main]

mod common;

use common::{le32, le64};
use libfuzzer_sys::fuzz_target;
use verityfs::descriptor::{DESCRIPTOR_SIZE, MAX_DESCRIPTOR_SIZE};
use verityfs::layout::{EnablingRecord, Location, ENABLING_SIZE, LOCATION_SIZE, TREE_ALIGNMENT};

fuzz_target!(|data: &[u8]| {
    if let Ok(location) = Location::decode(data) {
        assert_eq!(data.len(), LOCATION_SIZE);
        assert_eq!(&location.encode()[..], data);
        check_invariants(&location);
        assert_eq!(
            Location::new(location.data_size, location.tree_size, location.desc_size).unwrap(),
            location
        );
    }
    if let Ok(record) = EnablingRecord::decode(data) {
        assert_eq!(data.len(), ENABLING_SIZE);
        assert_eq!(&record.encode()[..], data);
        assert_eq!(record.data_size, le64(data, 8));
    }

    if data.len() >= 20 {
        let (data_size, tree_size, desc_size) = (le64(data, 0), le64(data, 8), le32(data, 16));
        if let Ok(location) = Location::new(data_size, tree_size, desc_size) {
            check_invariants(&location);
            let decoded = Location::decode(&location.encode());
            if (DESCRIPTOR_SIZE..=MAX_DESCRIPTOR_SIZE).contains(&(desc_size as usize)) {
                assert_eq!(decoded.unwrap(), location);
            } else {
                assert!(decoded.is_err());
            }
        } else {
            // Rejected only if the file would not fit in an off_t.
            let end = (data_size as u128).next_multiple_of(TREE_ALIGNMENT as u128)
                + tree_size as u128
                + desc_size as u128;
            assert!(
                end > i64::MAX as u128,
                "Location::new rejected a file of {end} bytes"
            );
        }
    }
});

fn check_invariants(l: &Location) {
    assert!(l.tree_pos >= l.data_size);
    assert!(l.tree_pos - l.data_size < TREE_ALIGNMENT);
    assert_eq!(l.tree_pos % TREE_ALIGNMENT, 0);
    assert_eq!(Some(l.desc_pos), l.tree_pos.checked_add(l.tree_size));
    let end = l.end().expect("end overflows");
    assert!(end <= i64::MAX as u64);
    assert_eq!(end, l.desc_pos + u64::from(l.desc_size));
}
