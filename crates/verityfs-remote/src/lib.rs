//! verityfs images read from a web server (HTTP range requests) or an
//! S3-compatible object store, and published to an object store.
//!
//! A [`RemoteStore`] is a [`verityfs::image::Store`]: the image file system
//! asks it for the manifest and the objects, and verifies every byte it
//! returns, so nothing here is trusted. What is here is speed and bounds:
//! byte ranges fetched in chunks, sequential streams read ahead with several
//! requests in flight, random reads fetched exactly, a bounded amount of
//! memory, and a hard limit on how long each request of a read waits for
//! the network.

#![forbid(unsafe_code)]

mod checked_http;
mod chunks;
mod credentials;
mod disk;
mod errors;
mod fetch;
mod object;
mod options;
mod runtime;
mod store;
mod upload;

pub use credentials::without_credentials;
pub use options::RemoteOptions;
pub use store::RemoteStore;
pub use upload::Uploaded;
