//! object_store's errors as the I/O errors a [`Source`](verityfs::Source)
//! gives.

use std::io;

/// `e` as an I/O error: a missing object is `NotFound` (an image whose
/// object is gone), anything else `Other` (the reader gets `EIO`), with
/// object_store's message.
pub(crate) fn io_error(e: object_store::Error) -> io::Error {
    let kind = match &e {
        object_store::Error::NotFound { .. } => io::ErrorKind::NotFound,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e)
}

/// The error of a read past the end of an object.
pub(crate) fn past_end() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "read past the end of the object",
    )
}
