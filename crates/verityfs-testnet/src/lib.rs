//! Real network servers on 127.0.0.1 for the integration tests and
//! benchmarks of remote image mounts, whose clients read images with HTTP
//! range requests over kept-alive HTTP/1.1 connections:
//!
//! - [`Nginx`]: a private nginx serving a directory, with its access log
//!   parsed back ([`Nginx::requests`]) to count and inspect requests;
//! - [`Proxy`]: an HTTP/1.1 proxy in front of any of them, with
//!   [`Faults`] set at run time (latency, cut or reset connections, a
//!   flipped byte, error statuses, a server that never answers);
//! - [`Moto`]: moto's S3-compatible server;
//! - [`http`]: a minimal blocking client to check what they answer.
//!
//! Each server is stopped, its processes or threads ended, when dropped.
//! A server that cannot run (nginx or the moto venv missing) is an error
//! saying what to install: the tests fail, never skip.

#![forbid(unsafe_code)]

mod daemon;
pub mod http;
mod moto;
mod nginx;
mod proxy;
mod wire;

pub use moto::{Moto, ACCESS_KEY_ID, DEFAULT_VENV, MOTO_REQUIREMENT, REGION, SECRET_ACCESS_KEY};
pub use nginx::{Nginx, Request};
pub use proxy::{Faults, Proxy};
