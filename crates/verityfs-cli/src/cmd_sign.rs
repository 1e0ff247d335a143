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

use crate::commands::{usage_unless, Command, EXIT_FAILURE, EXIT_OK};
use crate::file_digest::{self, DigestOptions};
use crate::getopt::LongOpt;
use crate::output::{error_msg, error_msg_errno, print_stdout, quote};

const OPT_KEY: u32 = 1;
const OPT_CERT: u32 = 2;
const OPT_PKCS11_ENGINE: u32 = 3;
const OPT_PKCS11_MODULE: u32 = 4;
const OPT_PKCS11_KEYID: u32 = 5;

/// The options of `sign` before the shared ones ([`file_digest::longopts`]),
/// in fsverity's table order.
const LONGOPTS: &[LongOpt] = &[
    LongOpt::required("key", OPT_KEY).with_help("Private key (PEM, PKCS#8) to sign with"),
    LongOpt::required("cert", OPT_CERT)
        .with_help("Certificate (PEM) of the key; default: read it from KEYFILE"),
    LongOpt::required("pkcs11-engine", OPT_PKCS11_ENGINE)
        .with_help("OpenSSL PKCS#11 engine (not supported by verityfs)"),
    LongOpt::required("pkcs11-module", OPT_PKCS11_MODULE)
        .with_help("PKCS#11 token module (not supported by verityfs)"),
    LongOpt::required("pkcs11-keyid", OPT_PKCS11_KEYID)
        .with_help("PKCS#11 key identifier (not supported by verityfs)"),
];

/// All the options of `sign`, in fsverity's table order.
pub fn longopts() -> Vec<LongOpt> {
    file_digest::longopts(LONGOPTS, &[])
}

/// Everything the options of `sign` ask for.
#[derive(Default)]
struct SignArgs {
    digest: DigestOptions,
    key: Option<OsString>,
    cert: Option<OsString>,
    pkcs11_engine: Option<OsString>,
    pkcs11_module: Option<OsString>,
    pkcs11_keyid: Option<OsString>,
}

/// Runs `verityfs sign`.
pub fn run(cmd: &Command, args: &[OsString]) -> u8 {
    let mut opts = SignArgs::default();
    let longopts = longopts();
    let parsed = cmd.parse_options(args, &longopts, |id, value| {
        usage_unless(opts.take(id, value))
    });
    let (file, sig_file) = match parsed.as_deref() {
        Ok([file, sig_file]) => (file, sig_file),
        Ok(_) => return cmd.usage_error(),
        Err(&status) => return status,
    };
    let Ok(descriptor) = opts.digest.compute(file) else {
        return EXIT_FAILURE;
    };
    let Ok(sig) = opts.sign(&descriptor) else {
        error_msg("failed to sign digest");
        return EXIT_FAILURE;
    };
    if write_signature(sig_file, &sig).is_err() {
        return EXIT_FAILURE;
    }
    let alg = descriptor.params().hash_algorithm();
    let digest = descriptor.file_digest();
    print_stdout(&quote(
        "Signed file '",
        file,
        &format!("' ({alg}:{digest})\n"),
    ));
    EXIT_OK
}

impl SignArgs {
    fn take(&mut self, id: u32, value: OsString) -> bool {
        let (slot, name) = match id {
            OPT_KEY => (&mut self.key, "--key"),
            OPT_CERT => (&mut self.cert, "--cert"),
            OPT_PKCS11_ENGINE => (&mut self.pkcs11_engine, "--pkcs11-engine"),
            OPT_PKCS11_MODULE => (&mut self.pkcs11_module, "--pkcs11-module"),
            OPT_PKCS11_KEYID => (&mut self.pkcs11_keyid, "--pkcs11-keyid"),
            _ => return self.digest.parse_option(id, &value),
        };
        if slot.is_some() {
            error_msg(format!("{name} can only be specified once"));
            return false;
        }
        *slot = Some(value);
        true
    }

    /// Signs as `libfsverity_sign_digest()` does, in its order: the
    /// certificate (by default from the key file), then the private key,
    /// then the PKCS#7 signature. Errors are printed here, except the final
    /// `failed to sign digest`.
    fn sign(&self, descriptor: &Descriptor) -> Result<Vec<u8>, ()> {
        let Some(cert_file) = self.cert.as_ref().or(self.key.as_ref()) else {
            error_msg("no certificate specified");
            return Err(());
        };
        let cert = read_pem(cert_file).and_then(|pem| Certificate::from_pem(&pem));
        let cert = cert.map_err(|e| report(&e, cert_file))?;
        let pkcs11 = [&self.pkcs11_engine, &self.pkcs11_module, &self.pkcs11_keyid];
        if pkcs11.iter().any(|o| o.is_some()) {
            error_msg(match self.key {
                Some(_) => {
                    "private key must be specified either by file or by PKCS#11 token, not both"
                }
                None => "verityfs doesn't support PKCS#11 tokens",
            });
            return Err(());
        }
        let Some(key_file) = &self.key else {
            error_msg("no private key specified");
            return Err(());
        };
        let key = read_pem(key_file).and_then(|pem| SigningKey::from_pem(&pem));
        let key = key.map_err(|e| report(&e, key_file))?;
        let alg = descriptor.params().hash_algorithm();
        let digest = descriptor.file_digest();
        signature::sign_digest_with(alg, &digest, &key, &cert).map_err(|e| report(&e, key_file))
    }
}

fn read_pem(name: &OsStr) -> Result<Vec<u8>, SignError> {
    signature::read_pem_file(Path::new(name))
}

/// Prints libfsverity's message for `e` about file `name`, then OpenSSL's
/// errors as its `error_msg_openssl()` does.
fn report(e: &SignError, name: &OsStr) {
    error_msg(match e {
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
        error_msg("OpenSSL library errors:");
        for line in errors.lines() {
            error_msg(line);
        }
    }
}

/// Writes the signature file as fsverity's `write_signature()` does.
fn write_signature(name: &OsStr, sig: &[u8]) -> Result<(), ()> {
    let mut file = file_digest::create_output(name)
        .map_err(|e| error_msg_errno(quote("can't open '", name, "' for writing"), &e))?;
    file.write_all(sig)
        .map_err(|e| error_msg_errno(quote("writing to '", name, "'"), &e))
}
