//! `verityfs sign`: sign a file's fs-verity digest for built-in signature
//! verification, as `fsverity sign` does (fsverity-utils
//! `programs/cmd_sign.c` and `libfsverity_sign_digest()`), producing the
//! same DER PKCS#7 bytes through the same OpenSSL calls
//! ([`verityfs::signature`]).
//!
//! PKCS#11 tokens (`--pkcs11-*`) are not supported: the options are
//! accepted and reported as fsverity v1.5 reports them when it is built
//! without PKCS#11 support (after the certificate is read, before any key).

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::Path;

use verityfs::signature::{self, Certificate, SignError, SigningKey};
use verityfs::Descriptor;

use crate::commands::Command;
use crate::error::{Context, Error, Result};
use crate::file_digest::{self, out_descriptor, out_merkle_tree, DigestOptions, HasDigest};
use crate::opts::{exactly, Args, Hint, Operand, Opt};
use crate::output::{print_stdout, quote};
use crate::tree_params::{block_size, hash_alg, once, salt};

/// Everything the options of `sign` ask for.
#[derive(Default)]
pub struct SignArgs {
    digest: DigestOptions,
    key: Option<OsString>,
    cert: Option<OsString>,
    pkcs11_engine: Option<OsString>,
    pkcs11_module: Option<OsString>,
    pkcs11_keyid: Option<OsString>,
}

impl HasDigest for SignArgs {
    fn digest(&mut self) -> &mut DigestOptions {
        &mut self.digest
    }
}

/// Sets an option fsverity takes once.
fn set_once(slot: &mut Option<OsString>, name: &str, value: OsString) -> Result<()> {
    once(slot, name)?;
    *slot = Some(value);
    Ok(())
}

impl Args for SignArgs {
    const OPTIONS: &'static [Opt<Self>] = &[
        Opt::<Self>::value(
            "key",
            "KEYFILE",
            "Private key (PEM, PKCS#8) to sign with",
            |a, v| set_once(&mut a.key, "--key", v),
        )
        .hint(Hint::File)
        .new_line(),
        Opt::<Self>::value(
            "cert",
            "CERTFILE",
            "Certificate (PEM) of the key; default: read it from KEYFILE",
            |a, v| set_once(&mut a.cert, "--cert", v),
        )
        .hint(Hint::File),
        Opt::<Self>::value(
            "pkcs11-engine",
            "SOFILE",
            "OpenSSL PKCS#11 engine (not supported by verityfs)",
            |a, v| set_once(&mut a.pkcs11_engine, "--pkcs11-engine", v),
        )
        .hint(Hint::File),
        Opt::<Self>::value(
            "pkcs11-module",
            "SOFILE",
            "PKCS#11 token module (not supported by verityfs)",
            |a, v| set_once(&mut a.pkcs11_module, "--pkcs11-module", v),
        )
        .hint(Hint::File)
        .new_line(),
        Opt::<Self>::value(
            "pkcs11-keyid",
            "KEYID",
            "PKCS#11 key identifier (not supported by verityfs)",
            |a, v| set_once(&mut a.pkcs11_keyid, "--pkcs11-keyid", v),
        ),
        hash_alg(),
        block_size(),
        salt(),
        out_merkle_tree(),
        out_descriptor(),
    ];
    const OPERANDS: &'static [Operand] = &[
        Operand::one(
            "FILE",
            "The file to compute the fs-verity digest of",
            Hint::File,
        ),
        Operand::one(
            "OUT_SIGFILE",
            "Where to write the PKCS#7 DER signature",
            Hint::File,
        ),
    ];

    fn run(self, _: &Command, operands: Vec<OsString>) -> Result<()> {
        let [file, sig_file] = exactly(operands)?;
        let descriptor = self.digest.compute(&file)?;
        let sig = self.sign(&descriptor).context("failed to sign digest")?;
        write_signature(&sig_file, &sig)?;
        let alg = descriptor.params().hash_algorithm();
        let digest = descriptor.file_digest();
        print_stdout(&quote(
            "Signed file '",
            &file,
            &format!("' ({alg}:{digest})\n"),
        ));
        Ok(())
    }
}

impl SignArgs {
    /// Signs as `libfsverity_sign_digest()` does, in its order: the
    /// certificate (by default from the key file), then the private key,
    /// then the PKCS#7 signature.
    fn sign(&self, descriptor: &Descriptor) -> Result<Vec<u8>> {
        let cert_file = (self.cert.as_ref().or(self.key.as_ref()))
            .ok_or_else(|| Error::msg("no certificate specified"))?;
        let cert = load_cert(cert_file)?;
        let pkcs11 = [&self.pkcs11_engine, &self.pkcs11_module, &self.pkcs11_keyid];
        if pkcs11.iter().any(|o| o.is_some()) {
            return Err(Error::msg(match self.key {
                Some(_) => {
                    "private key must be specified either by file or by PKCS#11 token, not both"
                }
                None => "verityfs doesn't support PKCS#11 tokens",
            }));
        }
        let key_file = self
            .key
            .as_ref()
            .ok_or_else(|| Error::msg("no private key specified"))?;
        let key = load_key(key_file)?;
        let alg = descriptor.params().hash_algorithm();
        let digest = descriptor.file_digest();
        signature::sign_digest_with(alg, &digest, &key, &cert).map_err(|e| report(&e, key_file))
    }
}

/// The certificate in the PEM file `name`, or libfsverity's report.
pub(crate) fn load_cert(name: &OsStr) -> Result<Certificate> {
    let cert = read_pem(name).and_then(|pem| Certificate::from_pem(&pem));
    cert.map_err(|e| report(&e, name))
}

/// The private key in the PEM file `name`, or libfsverity's report.
pub(crate) fn load_key(name: &OsStr) -> Result<SigningKey> {
    let key = read_pem(name).and_then(|pem| SigningKey::from_pem(&pem));
    key.map_err(|e| report(&e, name))
}

fn read_pem(name: &OsStr) -> Result<Vec<u8>, SignError> {
    signature::read_pem_file(Path::new(name))
}

/// libfsverity's message for `e` about file `name`, then OpenSSL's errors
/// as its `error_msg_openssl()` prints them.
fn report(e: &SignError, name: &OsStr) -> Error {
    let mut error = Error::msg(match e {
        SignError::Certificate(_) => quote(
            "Failed to parse X.509 certificate file '",
            name,
            "'.\n       Note: it must be in PEM format.",
        ),
        SignError::PrivateKey(_) => quote(
            "Failed to parse private key file '",
            name,
            "'.\n       Note: it must be in PEM PKCS#8 format.",
        ),
        SignError::Open { .. } => quote("can't open '", name, "' for reading"),
        other => other.to_string().into_bytes(),
    });
    if let Some(errors) = e.openssl_errors().filter(|e| !e.is_empty()) {
        error = error.context("OpenSSL library errors:");
        for line in errors.lines() {
            error = error.context(line);
        }
    }
    error
}

/// Writes the signature file as fsverity's `write_signature()` does.
fn write_signature(name: &OsStr, sig: &[u8]) -> Result<()> {
    let mut file = file_digest::create_output(name)
        .map_err(|e| Error::io(quote("can't open '", name, "' for writing"), &e))?;
    file.write_all(sig)
        .map_err(|e| Error::io(quote("writing to '", name, "'"), &e))
}
