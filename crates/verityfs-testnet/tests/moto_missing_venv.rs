//! Without moto's venv, starting moto fails saying how to create it. Its
//! own test binary: it changes the process's environment.

use verityfs_testnet::{Moto, MOTO_REQUIREMENT};

#[test]
fn a_missing_venv_is_an_error_saying_how_to_create_it() {
    let venv = tempfile::tempdir().unwrap();
    let missing = venv.path().join("missing");
    std::env::set_var("VERITYFS_MOTO_VENV", &missing);
    let error = Moto::start().err().unwrap().to_string();
    assert!(error.contains("scripts/test.sh"), "{error}");
    assert!(
        error.contains(&format!("python3 -m venv {}", missing.display())),
        "{error}"
    );
    assert!(error.contains(MOTO_REQUIREMENT), "{error}");
}
