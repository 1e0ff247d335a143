//! Images: a directory tree published as content-addressed verity objects
//! and a manifest (format: `docs/IMAGE.md`).

pub mod manifest;

pub use manifest::{Entry, EntryKind, FileObject, Manifest, ManifestError};
