//! Built-in signatures against fsverity-utils and OpenSSL.
//!
//! Keys and self-signed certificates (RSA 2048, ECDSA P-256) are generated
//! at test time with the `openssl` command (Debian package `openssl`) in a
//! temporary directory. RSA signatures are deterministic, so
//! [`sign_digest`] must reproduce `fsverity sign` (v1.5, `/usr/bin/fsverity`)
//! byte for byte; ECDSA signatures are randomised, so they are checked by
//! verifying them, with [`verify_signature`] and with `openssl smime
//! -verify`. The kernel's errors for bad signatures (`EBADMSG`, `ENOKEY`,
//! `EKEYREJECTED`) are checked on crafted cases.

#![cfg(feature = "openssl")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::random_bytes;
use verityfs::signature::{
    sign_digest, sign_digest_with, verify_signature, Certificate, Pkcs7Step, SignError, SigningKey,
};
use verityfs::{
    build_merkle_tree, formatted_digest, Digest, DiscardTree, Error, HashAlgorithm,
    MerkleTreeParams, SignatureError,
};

const FSVERITY: &str = "/usr/bin/fsverity";

type SignResult = Result<Vec<u8>, SignError>;

/// The generated keys and certificates, shared by all tests.
struct Keys {
    dir: tempfile::TempDir,
}

impl Keys {
    /// Signs `digest` with key `key` and certificate `cert` (by name).
    fn sign(&self, alg: HashAlgorithm, digest: &Digest, key: &str, cert: &str) -> SignResult {
        sign_digest_with(alg, digest, &self.key(key), &self.cert(cert))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path(name)).unwrap()
    }

    fn key(&self, name: &str) -> SigningKey {
        SigningKey::from_pem(&self.read(&format!("{name}.key"))).unwrap()
    }

    fn cert(&self, name: &str) -> Certificate {
        Certificate::from_pem(&self.read(&format!("{name}.crt"))).unwrap()
    }
}

/// Runs a command and panics with its stderr unless it succeeds.
fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Makes `<name>.key` and a self-signed certificate `<name>.crt` for
/// subject `CN=<subject>` and serial number `serial` in `dir`, with
/// `openssl req` and the key options `newkey`.
fn make_key(dir: &Path, name: &str, subject: &str, serial: u32, newkey: &[&str]) {
    let (key, crt) = (format!("{name}.key"), format!("{name}.crt"));
    let subject = format!("/CN={subject}");
    let serial = serial.to_string();
    let args = ["req", "-x509", "-nodes", "-days", "30", "-subj", &subject];
    run(Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .args(["-set_serial", &serial, "-keyout", &key, "-out", &crt])
        .args(newkey));
}

/// Fresh keys for one test (removed when it ends).
fn keys() -> Keys {
    let dir = tempfile::Builder::new()
        .prefix("verityfs-sig")
        .tempdir()
        .unwrap();
    let rsa = ["-newkey", "rsa:2048"];
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    make_key(dir.path(), "rsa", "verityfs rsa", 1, &rsa);
    make_key(dir.path(), "rsa-other", "verityfs rsa-other", 2, &rsa);
    make_key(dir.path(), "ec", "verityfs ec", 3, &ec);
    // Same subject and serial as "rsa", another key: the signer matches by
    // issuer and serial number, but the signature cannot verify.
    make_key(dir.path(), "rsa-impostor", "verityfs rsa", 1, &rsa);
    Keys { dir }
}

/// The file digest of `data` with `alg`, block size `bs` and `salt`.
fn file_digest(data: &[u8], alg: HashAlgorithm, bs: u32, salt: &[u8]) -> Digest {
    let params = MerkleTreeParams::new(alg, bs.into(), salt).unwrap();
    let (descriptor, _) =
        build_merkle_tree(&params, data.len() as u64, data, DiscardTree, &mut |_| {
            Ok(())
        })
        .unwrap();
    descriptor.file_digest()
}

/// `fsverity sign` of `file` with `key`/`cert` and the tree options `opts`;
/// returns the signature and the digest printed.
fn fsverity_sign(keys: &Keys, file: &Path, key: &str, opts: &[String]) -> (Vec<u8>, String) {
    let out = tempfile::NamedTempFile::new().unwrap();
    let stdout = run(Command::new(FSVERITY)
        .arg("sign")
        .arg(file)
        .arg(out.path())
        .arg(format!(
            "--key={}",
            keys.path(&format!("{key}.key")).display()
        ))
        .arg(format!(
            "--cert={}",
            keys.path(&format!("{key}.crt")).display()
        ))
        .args(opts));
    (
        std::fs::read(out.path()).unwrap(),
        String::from_utf8(stdout).unwrap(),
    )
}

#[test]
fn rsa_signatures_equal_fsverity_sign() {
    let keys = keys();
    let cases: &[(HashAlgorithm, u32, &[u8], usize)] = &[
        (HashAlgorithm::Sha256, 4096, b"", 100_000),
        (HashAlgorithm::Sha512, 4096, b"", 100_000),
        (HashAlgorithm::Sha256, 1024, b"\x12\x34\x56", 0),
        (HashAlgorithm::Sha512, 65536, &[0xab; 32], 1 << 20),
        (HashAlgorithm::Sha256, 4096, b"", 4096),
    ];
    for (i, &(alg, bs, salt, len)) in cases.iter().enumerate() {
        let contents = random_bytes(len, i as u64 + 7);
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &contents).unwrap();
        let digest = file_digest(&contents, alg, bs, salt);

        let mut opts = vec![format!("--hash-alg={alg}"), format!("--block-size={bs}")];
        if !salt.is_empty() {
            opts.push(format!("--salt={}", hex::encode(salt)));
        }
        let (expected, stdout) = fsverity_sign(&keys, file.path(), "rsa", &opts);
        assert!(
            stdout.contains(&format!("({alg}:{digest})")),
            "case {i}: fsverity printed {stdout:?}, we computed {digest}"
        );

        let ours = sign_digest(alg, &digest, &keys.read("rsa.key"), &keys.read("rsa.crt")).unwrap();
        assert_eq!(
            ours, expected,
            "case {i}: signature differs from fsverity sign"
        );
        verify_signature(&ours, alg, &digest, &[keys.cert("rsa")]).unwrap();
    }
}

#[test]
fn a_pem_file_with_key_and_certificate_serves_as_both() {
    // fsverity sign's --cert defaults to the --key file.
    let keys = keys();
    let mut both = keys.read("rsa.key");
    both.extend_from_slice(&keys.read("rsa.crt"));
    let digest = file_digest(b"hello", HashAlgorithm::Sha256, 4096, b"");
    let sig = sign_digest(HashAlgorithm::Sha256, &digest, &both, &both).unwrap();
    verify_signature(&sig, HashAlgorithm::Sha256, &digest, &[keys.cert("rsa")]).unwrap();
}

#[test]
fn a_der_certificate_verifies_as_its_pem_form_does() {
    // DER is the form `keyctl padd asymmetric '' %keyring:.fs-verity` takes.
    let keys = keys();
    run(Command::new("openssl").current_dir(keys.path("")).args([
        "x509", "-in", "rsa.crt", "-outform", "DER", "-out", "rsa.der",
    ]));
    let der = Certificate::from_der(&keys.read("rsa.der")).unwrap();
    let digest = file_digest(b"hello", HashAlgorithm::Sha256, 4096, b"");
    let sig = keys
        .sign(HashAlgorithm::Sha256, &digest, "rsa", "rsa")
        .unwrap();
    verify_signature(&sig, HashAlgorithm::Sha256, &digest, &[der]).unwrap();
    let other = Certificate::from_der(&keys.read("rsa-other.crt"));
    assert!(other.is_err(), "a PEM file read as DER");
}

/// Verifies `sig` over `formatted` with `openssl smime`, the signer's
/// certificate supplied from `cert` (the signature carries none).
fn openssl_smime_verify(sig: &[u8], formatted: &[u8], cert: &Path) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("sig.der"), sig).unwrap();
    std::fs::write(dir.path().join("digest.bin"), formatted).unwrap();
    run(Command::new("openssl")
        .current_dir(dir.path())
        .args([
            "smime", "-verify", "-binary", "-inform", "der", "-in", "sig.der",
        ])
        .args(["-content", "digest.bin", "-noverify", "-out", "/dev/null"])
        .arg("-certfile")
        .arg(cert));
}

#[test]
fn ecdsa_signatures_verify() {
    let keys = keys();
    for (i, alg) in HashAlgorithm::ALL.into_iter().enumerate() {
        let contents = random_bytes(50_000, 100 + i as u64);
        let digest = file_digest(&contents, alg, 4096, b"");
        let sig = sign_digest(alg, &digest, &keys.read("ec.key"), &keys.read("ec.crt")).unwrap();
        verify_signature(&sig, alg, &digest, &[keys.cert("rsa"), keys.cert("ec")]).unwrap();
        openssl_smime_verify(&sig, &formatted_digest(alg, &digest), &keys.path("ec.crt"));

        // fsverity sign's ECDSA signature of the same file is accepted too.
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &contents).unwrap();
        let (theirs, _) = fsverity_sign(&keys, file.path(), "ec", &[format!("--hash-alg={alg}")]);
        verify_signature(&theirs, alg, &digest, &[keys.cert("ec")]).unwrap();
    }
}

#[test]
fn rsa_signature_verifies_with_openssl() {
    let keys = keys();
    let digest = file_digest(&random_bytes(9999, 3), HashAlgorithm::Sha512, 4096, b"");
    let sig = keys
        .sign(HashAlgorithm::Sha512, &digest, "rsa", "rsa")
        .unwrap();
    openssl_smime_verify(
        &sig,
        &formatted_digest(HashAlgorithm::Sha512, &digest),
        &keys.path("rsa.crt"),
    );
}

/// The errno `verify_signature` gives, through the crate's `Error`.
fn verify_errno(sig: &[u8], alg: HashAlgorithm, digest: &Digest, trusted: &[Certificate]) -> i32 {
    let err = verify_signature(sig, alg, digest, trusted).unwrap_err();
    Error::from(err).errno()
}

#[test]
fn kernel_errors_for_bad_signatures() {
    let keys = keys();
    let alg = HashAlgorithm::Sha256;
    let digest = file_digest(&random_bytes(12345, 1), alg, 4096, b"");
    let other = file_digest(&random_bytes(12345, 2), alg, 4096, b"");
    let rsa = keys.sign(alg, &digest, "rsa", "rsa").unwrap();
    let ec = keys.sign(alg, &digest, "ec", "ec").unwrap();
    let trusted = [keys.cert("rsa"), keys.cert("ec")];

    for sig in [&rsa, &ec] {
        verify_signature(sig, alg, &digest, &trusted).unwrap();
        // Signer not among the trusted certificates.
        let untrusted = [keys.cert("rsa-other")];
        assert_eq!(verify_errno(sig, alg, &digest, &untrusted), libc::ENOKEY);
        // Nothing trusted at all: ENOKEY before even parsing.
        assert_eq!(verify_errno(sig, alg, &digest, &[]), libc::ENOKEY);
        // Another file's digest.
        assert_eq!(verify_errno(sig, alg, &other, &trusted), libc::EKEYREJECTED);
        // The same digest bytes claimed for another algorithm's file are
        // another formatted digest.
        let sha512 = file_digest(&random_bytes(12345, 1), HashAlgorithm::Sha512, 4096, b"");
        let err = verify_errno(sig, HashAlgorithm::Sha512, &sha512, &trusted);
        assert_eq!(err, libc::EKEYREJECTED);
        // Malformed: truncated, or garbage.
        let truncated = &sig[..sig.len() - 10];
        assert_eq!(
            verify_errno(truncated, alg, &digest, &trusted),
            libc::EBADMSG
        );
        assert_eq!(
            verify_errno(b"\x30\x03abc", alg, &digest, &trusted),
            libc::EBADMSG
        );
        assert_eq!(verify_errno(b"", alg, &digest, &trusted), libc::EBADMSG);
        // A flipped bit in the signature value (its last bytes).
        let mut flipped = sig.clone();
        *flipped.last_mut().unwrap() ^= 1;
        let err = verify_signature(&flipped, alg, &digest, &trusted).unwrap_err();
        assert!(
            matches!(err, SignatureError::Rejected | SignatureError::Malformed),
            "{err:?}"
        );
    }
    // A certificate with the signer's issuer and serial number but another
    // key: found, and the signature does not verify with it.
    let impostor = [keys.cert("rsa-impostor")];
    assert_eq!(
        verify_errno(&rsa, alg, &digest, &impostor),
        libc::EKEYREJECTED
    );
    // A SignedData with a certificate but no signer (`openssl crl2pkcs7`):
    // no signer is trusted, as in the kernel's pkcs7_validate_trust().
    let no_signer = run(Command::new("openssl")
        .args(["crl2pkcs7", "-nocrl", "-outform", "der", "-certfile"])
        .arg(keys.path("rsa.crt")));
    assert_eq!(
        verify_errno(&no_signer, alg, &digest, &trusted),
        libc::ENOKEY
    );
}

#[test]
fn signing_errors() {
    let keys = keys();
    let digest = file_digest(b"x", HashAlgorithm::Sha256, 4096, b"");
    // A key that does not belong to the certificate.
    let err = keys
        .sign(HashAlgorithm::Sha256, &digest, "ec", "rsa")
        .unwrap_err();
    assert!(
        matches!(err, SignError::Pkcs7(Pkcs7Step::AddSigner, _)),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "failed to add signer to PKCS#7 signature object"
    );
    assert_eq!(err.errno(), libc::EINVAL);
    let lines = err.openssl_errors().unwrap().lines();
    assert!(
        lines.iter().any(|l| l.contains("PKCS7_sign_add_signer")),
        "{lines:?}"
    );
    // Certificate parsed before the key, as libfsverity does.
    let err = sign_digest(HashAlgorithm::Sha256, &digest, b"bad", b"bad").unwrap_err();
    assert!(matches!(err, SignError::Certificate(_)), "{err:?}");
    let err = sign_digest(
        HashAlgorithm::Sha256,
        &digest,
        b"bad",
        &keys.read("rsa.crt"),
    )
    .unwrap_err();
    assert!(matches!(err, SignError::PrivateKey(_)), "{err:?}");
    assert_eq!(err.errno(), libc::EBADMSG);
    // A digest of the wrong length for its algorithm.
    let err = keys
        .sign(HashAlgorithm::Sha512, &digest, "rsa", "rsa")
        .unwrap_err();
    assert!(matches!(err, SignError::MalformedDigest), "{err:?}");
}
