//! The mount-wide built-in signature policy (kernel:
//! `fs/verity/signature.c` and the `fs.verity.require_signatures` sysctl):
//! which certificates are trusted, and whether unsigned files are refused.

use std::sync::Arc;

use verityfs::signature::{verify_signature, Certificate};
use verityfs::{Descriptor, SignatureError};

/// Checks built-in signatures at enable and at open.
///
/// With trusted certificates, any signature a file carries must verify
/// against one of them (`EBADMSG`, `ENOKEY`, `EKEYREJECTED` otherwise),
/// as in the kernel. With signatures required, unsigned files can neither be
/// enabled nor opened (`EPERM`). Without trusted certificates, signatures
/// are stored and returned but not checked.
#[derive(Clone, Debug, Default)]
pub struct SignaturePolicy {
    trusted: Arc<Vec<Certificate>>,
    require: bool,
}

impl SignaturePolicy {
    /// A policy trusting `trusted`, refusing unsigned files if `require`.
    pub fn new(trusted: Vec<Certificate>, require: bool) -> Self {
        SignaturePolicy {
            trusted: Arc::new(trusted),
            require,
        }
    }

    /// The same policy, also trusting `more`.
    pub fn trusting(self, more: Vec<Certificate>) -> Self {
        let mut trusted = Vec::clone(&self.trusted);
        trusted.extend(more);
        SignaturePolicy {
            trusted: Arc::new(trusted),
            ..self
        }
    }

    /// The same policy, refusing unsigned files.
    pub fn requiring(self) -> Self {
        SignaturePolicy {
            require: true,
            ..self
        }
    }

    /// Whether a file with `descriptor` and built-in signature `signature`
    /// (empty if none) is acceptable.
    pub fn check(&self, descriptor: &Descriptor, signature: &[u8]) -> Result<(), SignatureError> {
        if signature.is_empty() {
            return if self.require {
                Err(SignatureError::Missing)
            } else {
                Ok(())
            };
        }
        if self.trusted.is_empty() && !self.require {
            return Ok(());
        }
        let alg = descriptor.params().hash_algorithm();
        verify_signature(signature, alg, &descriptor.file_digest(), &self.trusted)
    }
}
