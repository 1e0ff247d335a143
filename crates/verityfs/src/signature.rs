//! fs-verity built-in signatures: a PKCS#7 signature over the formatted
//! digest ([`formatted_digest`]), made as fsverity-utils' `fsverity sign`
//! makes it and checked by the rules of the kernel's
//! `fsverity_verify_signature()`.
//!
//! # Why OpenSSL
//!
//! fsverity-utils signs with OpenSSL (`lib/sign_digest.c`: `PKCS7_sign()`
//! with `PKCS7_PARTIAL`, `PKCS7_sign_add_signer()` with the file's hash
//! algorithm, `PKCS7_final()`, `i2d_PKCS7_bio()`). Calling the same OpenSSL
//! functions gives the same DER, byte for byte (RSA signatures are
//! deterministic, so whole signature files compare equal; ECDSA ones differ
//! only in the random signature value), and the same OpenSSL error reports
//! when a key or certificate is bad. A pure-Rust PKCS#7 stack could
//! reproduce the bytes too, but only by re-encoding OpenSSL's choices (field
//! order, `NULL` parameters, signature algorithm identifiers) by hand.
//!
//! The `openssl` crate wraps everything needed except `PKCS7_sign_add_signer()`
//! and `PKCS7_final()` (without them OpenSSL picks the key's default digest,
//! so SHA-512 files could not be signed as fsverity-utils signs them) and
//! `BIO_new_file()` (only used to obtain OpenSSL's own report of a key or
//! certificate file that cannot be opened). They are declared here: this
//! module and `sha256_mb` are the only ones where the crate allows `unsafe`
//! code, and every `unsafe` block says why it is sound.
//!
//! # Verification rules
//!
//! [`verify_signature`] answers as the kernel does for `FS_IOC_ENABLE_VERITY`
//! with a signature: no trusted certificate at all → `ENOKEY` (the kernel's
//! empty-keyring shortcut, taken before parsing); not a DER PKCS#7
//! SignedData → `EBADMSG`; a signer whose issuer and serial number match no
//! trusted certificate → `ENOKEY`; a trusted signer whose signature does not
//! verify over this file's formatted digest → `EKEYREJECTED`.
//!
//! Known differences from the kernel, all outside what `fsverity sign`
//! produces: certificates embedded in the message are never used (the kernel
//! can follow a chain from an embedded signer certificate to a trusted one);
//! with several signers every one must be trusted (the kernel needs one);
//! signer identifiers by subject key identifier (CMS style) are not
//! understood by OpenSSL's PKCS#7 parser and count as malformed.

use std::ffi::CString;
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::marker::PhantomData;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr;

use foreign_types::ForeignType;
use openssl::error::ErrorStack;
use openssl::hash::MessageDigest;
use openssl::pkcs7::{Pkcs7, Pkcs7Flags};
use openssl::pkey::{PKey, Private};
use openssl::stack::Stack;
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::X509;
use std::ffi::{c_char, c_int};

use crate::descriptor::formatted_digest;
pub use crate::error::SignatureError;
use crate::hash_algs::{Digest, HashAlgorithm};

/// The OpenSSL functions the `openssl` and `openssl-sys` crates do not
/// declare, with their OpenSSL 1.1/3.x prototypes.
mod ffi {
    use openssl_sys::{BIO, EVP_MD, EVP_PKEY, PKCS7, PKCS7_SIGNER_INFO, X509};
    use std::ffi::{c_char, c_int};

    extern "C" {
        pub fn PKCS7_sign_add_signer(
            p7: *mut PKCS7,
            signcert: *mut X509,
            pkey: *mut EVP_PKEY,
            md: *const EVP_MD,
            flags: c_int,
        ) -> *mut PKCS7_SIGNER_INFO;
        pub fn PKCS7_final(p7: *mut PKCS7, data: *mut BIO, flags: c_int) -> c_int;
        pub fn BIO_new_file(filename: *const c_char, mode: *const c_char) -> *mut BIO;
    }
}

/// The flags fsverity-utils signs with: binary data, detached, no signed
/// attributes, no certificates, and built step by step so that the digest
/// algorithm can be chosen.
fn sign_flags() -> Pkcs7Flags {
    Pkcs7Flags::BINARY
        | Pkcs7Flags::DETACHED
        | Pkcs7Flags::NOATTR
        | Pkcs7Flags::NOCERTS
        | Pkcs7Flags::PARTIAL
}

/// An X.509 certificate: the signer's, or one trusted for verification (the
/// counterpart of a key in the kernel's `.fs-verity` keyring).
#[derive(Clone)]
pub struct Certificate(X509);

impl Certificate {
    /// The first certificate of a PEM file, as `PEM_read_bio_X509()` reads
    /// it (text before the `BEGIN` line is skipped).
    pub fn from_pem(pem: &[u8]) -> Result<Self, SignError> {
        Self::parsed(X509::from_pem(pem))
    }

    /// Every certificate of a PEM file (a bundle of trusted certificates).
    pub fn all_from_pem(pem: &[u8]) -> Result<Vec<Self>, SignError> {
        let certs = X509::stack_from_pem(pem).map_err(|e| SignError::Certificate(e.into()))?;
        Ok(certs.into_iter().map(Certificate).collect())
    }

    /// A DER certificate, the form the kernel's keyring takes.
    pub fn from_der(der: &[u8]) -> Result<Self, SignError> {
        Self::parsed(X509::from_der(der))
    }

    fn parsed(cert: Result<X509, ErrorStack>) -> Result<Self, SignError> {
        cert.map(Certificate)
            .map_err(|e| SignError::Certificate(e.into()))
    }
}

impl fmt::Debug for Certificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Certificate")
            .field(&self.0.subject_name())
            .finish()
    }
}

/// A private key to sign with (RSA, ECDSA, or anything else OpenSSL's
/// PKCS#7 code can sign with).
pub struct SigningKey(PKey<Private>);

impl SigningKey {
    /// A PEM private key (PKCS#8, or the traditional RSA/EC forms), as
    /// `PEM_read_bio_PrivateKey()` reads it. Like fsverity-utils, an
    /// encrypted key makes OpenSSL ask for the passphrase on the terminal.
    pub fn from_pem(pem: &[u8]) -> Result<Self, SignError> {
        PKey::private_key_from_pem(pem)
            .map(SigningKey)
            .map_err(|e| SignError::PrivateKey(e.into()))
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SigningKey").field(&self.0.id()).finish()
    }
}

/// Signs the file digest `digest` of a file hashed with `alg`, as
/// `fsverity sign` does: the certificate is parsed first, then the key,
/// then a detached DER PKCS#7 signature (no attributes, no certificates,
/// message digest `alg`) over `formatted_digest(alg, digest)` is returned.
pub fn sign_digest(
    alg: HashAlgorithm,
    digest: &Digest,
    key_pem: &[u8],
    cert_pem: &[u8],
) -> Result<Vec<u8>, SignError> {
    let cert = Certificate::from_pem(cert_pem)?;
    let key = SigningKey::from_pem(key_pem)?;
    sign_digest_with(alg, digest, &key, &cert)
}

/// [`sign_digest`] with an already parsed key and certificate.
pub fn sign_digest_with(
    alg: HashAlgorithm,
    digest: &Digest,
    key: &SigningKey,
    cert: &Certificate,
) -> Result<Vec<u8>, SignError> {
    if digest.as_bytes().len() != alg.digest_size() {
        return Err(SignError::MalformedDigest);
    }
    let data = formatted_digest(alg, digest);
    let md = match alg {
        HashAlgorithm::Sha256 => MessageDigest::sha256(),
        HashAlgorithm::Sha512 => MessageDigest::sha512(),
    };
    let flags = sign_flags().bits();
    let bio = MemBio::new(&data).ok_or_else(|| pkcs7_error(Pkcs7Step::OutOfMemory))?;

    // SAFETY: with PKCS7_PARTIAL and no signer, PKCS7_sign() only allocates
    // an empty detached SignedData (it does not read `bio`); the null
    // arguments are allowed, and the result is ours to free.
    let p7 = unsafe {
        openssl_sys::PKCS7_sign(
            ptr::null_mut(),
            ptr::null_mut(),
            ptr::null_mut(),
            bio.0,
            flags,
        )
    };
    if p7.is_null() {
        return Err(pkcs7_error(Pkcs7Step::Init));
    }
    // SAFETY: `p7` is a valid PKCS7 that nothing else owns; `Pkcs7` frees it.
    let p7 = unsafe { Pkcs7::from_ptr(p7) };

    // SAFETY: all pointers are valid for the call. OpenSSL takes its own
    // references to the certificate and key, and the returned signer info
    // belongs to `p7`, so nothing is freed here.
    let signer = unsafe {
        ffi::PKCS7_sign_add_signer(
            p7.as_ptr(),
            cert.0.as_ptr(),
            key.0.as_ptr(),
            md.as_ptr(),
            flags,
        )
    };
    if signer.is_null() {
        return Err(pkcs7_error(Pkcs7Step::AddSigner));
    }
    // SAFETY: `p7` and `bio` are valid; PKCS7_final() reads the data from
    // `bio` and keeps no reference to it.
    if unsafe { ffi::PKCS7_final(p7.as_ptr(), bio.0, flags) } != 1 {
        return Err(pkcs7_error(Pkcs7Step::Final));
    }
    p7.to_der()
        .map_err(|e| SignError::Pkcs7(Pkcs7Step::Encode, e.into()))
}

/// A failed PKCS#7 `step`, with the errors OpenSSL recorded.
fn pkcs7_error(step: Pkcs7Step) -> SignError {
    SignError::Pkcs7(step, OpensslErrors::take())
}

/// Checks the built-in signature `sig_der` of a file whose digest is
/// `digest` (algorithm `alg`) against the `trusted` certificates, with the
/// kernel's errors (see the [module docs](self)).
pub fn verify_signature(
    sig_der: &[u8],
    alg: HashAlgorithm,
    digest: &Digest,
    trusted: &[Certificate],
) -> Result<(), SignatureError> {
    if trusted.is_empty() {
        return Err(SignatureError::KeyNotTrusted);
    }
    let p7 = Pkcs7::from_der(sig_der).map_err(|_| SignatureError::Malformed)?;
    if p7.signed().is_none() {
        return Err(SignatureError::Malformed);
    }
    let mut certs = Stack::new().expect("OpenSSL out of memory");
    for cert in trusted {
        certs.push(cert.0.clone()).expect("OpenSSL out of memory");
    }
    // NOINTERN: signers are looked up among the trusted certificates only;
    // NOVERIFY: a trusted certificate is trusted as such, without a chain.
    let flags = Pkcs7Flags::NOINTERN | Pkcs7Flags::NOVERIFY | Pkcs7Flags::BINARY;
    p7.signers(&certs, flags)
        .map_err(|_| SignatureError::KeyNotTrusted)?;
    let store = X509StoreBuilder::new()
        .expect("OpenSSL out of memory")
        .build();
    let data = formatted_digest(alg, digest);
    p7.verify(&certs, &store, Some(&data), None, flags)
        .map_err(|_| SignatureError::Rejected)
}

/// Reads a key or certificate file, failing to open it exactly when
/// OpenSSL's `BIO_new_file(path, "r")` (which libfsverity uses) would, and
/// then with OpenSSL's report of the failure. A file that opens but cannot
/// be read (a directory) reads as empty, as it does for OpenSSL.
pub fn read_pem_file(path: &Path) -> Result<Vec<u8>, SignError> {
    match File::open(path) {
        Ok(mut file) => {
            let mut pem = Vec::new();
            let _ = file.read_to_end(&mut pem);
            Ok(pem)
        }
        Err(source) => Err(SignError::Open {
            path: path.to_owned(),
            openssl: openssl_open_errors(path),
            source,
        }),
    }
}

/// The errors OpenSSL records when it cannot open `path` for reading.
fn openssl_open_errors(path: &Path) -> OpensslErrors {
    let Ok(name) = CString::new(path.as_os_str().as_bytes()) else {
        return OpensslErrors::take();
    };
    let mode: &[u8] = b"r\0";
    // SAFETY: both arguments are NUL-terminated strings that outlive the
    // call; the result is null or a BIO that we own.
    let bio = unsafe { ffi::BIO_new_file(name.as_ptr(), mode.as_ptr().cast::<c_char>()) };
    if !bio.is_null() {
        // SAFETY: `bio` was just returned to us and is freed only here.
        unsafe { openssl_sys::BIO_free_all(bio) };
    }
    OpensslErrors::take()
}

/// A read-only memory BIO over borrowed bytes.
struct MemBio<'a>(*mut openssl_sys::BIO, PhantomData<&'a [u8]>);

impl<'a> MemBio<'a> {
    fn new(data: &'a [u8]) -> Option<Self> {
        let len = c_int::try_from(data.len()).ok()?;
        // SAFETY: BIO_new_mem_buf() keeps a pointer to `data` without copying
        // it; the lifetime on `MemBio` keeps `data` alive and unchanged until
        // the BIO is freed.
        let bio = unsafe { openssl_sys::BIO_new_mem_buf(data.as_ptr().cast(), len) };
        (!bio.is_null()).then_some(MemBio(bio, PhantomData))
    }
}

impl Drop for MemBio<'_> {
    fn drop(&mut self) {
        // SAFETY: the BIO is valid and owned by this value alone.
        unsafe { openssl_sys::BIO_free_all(self.0) };
    }
}

/// The step of OpenSSL's PKCS#7 signing that failed; displayed as
/// libfsverity's message for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pkcs7Step {
    /// Allocating the data buffer.
    OutOfMemory,
    /// `PKCS7_sign()`.
    Init,
    /// `PKCS7_sign_add_signer()` (for example, a key that does not match the
    /// certificate).
    AddSigner,
    /// `PKCS7_final()`.
    Final,
    /// `i2d_PKCS7()`.
    Encode,
}

impl fmt::Display for Pkcs7Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Pkcs7Step::OutOfMemory => "out of memory",
            Pkcs7Step::Init => "failed to initialize PKCS#7 signature object",
            Pkcs7Step::AddSigner => "failed to add signer to PKCS#7 signature object",
            Pkcs7Step::Final => "failed to finalize PKCS#7 signature",
            Pkcs7Step::Encode => "failed to DER-encode PKCS#7 signature object",
        })
    }
}

/// Why signing failed. The texts are libfsverity's where the file name is
/// not part of them; [`SignError::openssl_errors`] gives OpenSSL's own
/// report, which libfsverity prints after its message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SignError {
    /// A key or certificate file could not be opened.
    #[error("can't open '{}' for reading", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// What `open()` said.
        source: io::Error,
        /// What OpenSSL recorded.
        openssl: OpensslErrors,
    },
    /// Not a PEM (or DER) X.509 certificate.
    #[error("failed to parse X.509 certificate")]
    Certificate(OpensslErrors),
    /// Not a PEM private key.
    #[error("failed to parse private key")]
    PrivateKey(OpensslErrors),
    /// A digest whose length is not its algorithm's.
    #[error("malformed fsverity digest")]
    MalformedDigest,
    /// OpenSSL's PKCS#7 code failed.
    #[error("{0}")]
    Pkcs7(Pkcs7Step, OpensslErrors),
}

impl SignError {
    /// The errno libfsverity's `libfsverity_sign_digest()` returns for this.
    pub fn errno(&self) -> i32 {
        match self {
            SignError::Open { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            SignError::Certificate(_) | SignError::PrivateKey(_) => libc::EBADMSG,
            SignError::Pkcs7(Pkcs7Step::OutOfMemory, _) => libc::ENOMEM,
            SignError::MalformedDigest | SignError::Pkcs7(..) => libc::EINVAL,
        }
    }

    /// OpenSSL's errors behind this failure (possibly none).
    pub fn openssl_errors(&self) -> Option<&OpensslErrors> {
        match self {
            SignError::Open { openssl: e, .. }
            | SignError::Certificate(e)
            | SignError::PrivateKey(e)
            | SignError::Pkcs7(_, e) => Some(e),
            SignError::MalformedDigest => None,
        }
    }
}

/// OpenSSL's error queue as taken after a failure, with the thread it was
/// recorded on.
#[derive(Debug, Clone)]
pub struct OpensslErrors {
    stack: ErrorStack,
    thread: String,
}

impl OpensslErrors {
    /// Takes (and clears) this thread's OpenSSL errors.
    fn take() -> Self {
        ErrorStack::get().into()
    }

    /// Whether OpenSSL recorded nothing.
    pub fn is_empty(&self) -> bool {
        self.stack.errors().is_empty()
    }

    /// The lines OpenSSL's `ERR_print_errors_cb()` would hand its callback
    /// for these errors, each ending in a newline: the thread id (hex bytes
    /// in OpenSSL 3, a decimal number in 1.1), then `error:<code>:<library>:
    /// <function>:<reason>:<file>:<line>:<data>`. libfsverity prints each
    /// after `ERROR: `.
    pub fn lines(&self) -> Vec<String> {
        let errors = self.stack.errors().iter();
        errors
            .map(|e| format!("{}:{}\n", self.thread, error_string(e)))
            .collect()
    }
}

/// One error as OpenSSL's `ossl_err_string_int()` and the rest of
/// `ERR_print_errors_cb()` format it. Unlike the `openssl` crate's
/// `Display`, a system error's reason is the errno's text (OpenSSL 3 keeps
/// the errno itself in the reason field), and a missing function is empty.
fn error_string(e: &openssl::error::Error) -> String {
    let code = e.code();
    let library = e
        .library()
        .map_or_else(|| format!("lib({})", e.library_code()), str::to_owned);
    let function = e.function().map_or_else(String::new, |f| f.to_string());
    let system_error = openssl::version::number() >= 0x3000_0000 && code & 0x8000_0000 != 0;
    let reason = match e.reason() {
        _ if system_error => errno_text(e.reason_code()),
        Some(reason) => reason.to_owned(),
        None => format!("reason({})", e.reason_code()),
    };
    let (file, line, data) = (e.file(), e.line(), e.data().unwrap_or(""));
    format!("error:{code:08X}:{library}:{function}:{reason}:{file}:{line}:{data}")
}

/// `strerror(errno)`.
fn errno_text(errno: c_int) -> String {
    let text = io::Error::from_raw_os_error(errno).to_string();
    let suffix = format!(" (os error {errno})");
    text.strip_suffix(&suffix).unwrap_or(&text).to_owned()
}

impl From<ErrorStack> for OpensslErrors {
    fn from(stack: ErrorStack) -> Self {
        OpensslErrors {
            stack,
            thread: openssl_thread_id(),
        }
    }
}

impl fmt::Display for OpensslErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.stack.fmt(f)
    }
}

/// This thread's id as OpenSSL prints it in error reports
/// (`CRYPTO_THREAD_get_current_id()`, which is `pthread_self()`).
fn openssl_thread_id() -> String {
    // SAFETY: pthread_self() has no preconditions and cannot fail.
    let id = unsafe { libc::pthread_self() };
    if openssl::version::number() >= 0x3000_0000 {
        id.to_ne_bytes()
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect()
    } else {
        id.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_and_no_trust() {
        let digest = HashAlgorithm::Sha256.hash(b"");
        assert_eq!(
            verify_signature(b"junk", HashAlgorithm::Sha256, &digest, &[]),
            Err(SignatureError::KeyNotTrusted)
        );
    }

    #[test]
    fn unopenable_file_reports_like_openssl() {
        let err = read_pem_file(Path::new("/nonexistent/key.pem")).unwrap_err();
        assert_eq!(err.errno(), libc::ENOENT);
        assert_eq!(
            err.to_string(),
            "can't open '/nonexistent/key.pem' for reading"
        );
        let lines = err.openssl_errors().unwrap().lines();
        assert!(!lines.is_empty());
        assert!(lines.iter().all(|l| l.ends_with('\n')), "{lines:?}");
        assert!(
            lines[0].contains("fopen(/nonexistent/key.pem, r)"),
            "{lines:?}"
        );
    }

    #[test]
    fn bad_pem() {
        let err = Certificate::from_pem(b"").unwrap_err();
        assert_eq!(err.errno(), libc::EBADMSG);
        assert!(err.openssl_errors().unwrap().lines()[0].contains("no start line"));
        assert_eq!(
            SigningKey::from_pem(b"x").unwrap_err().errno(),
            libc::EBADMSG
        );
    }
}
