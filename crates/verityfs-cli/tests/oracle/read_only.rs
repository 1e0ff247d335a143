//! A read-only filesystem: ext4 mounted again with `-o remount,ro`,
//! verityfs mounted with `-o ro`. Runs after the scenarios that write.

use std::fs::{self, File, OpenOptions};
use std::path::Path;
use std::process::Command;

use super::scenarios::{enable_on, measure_on};
use super::{open_outcome, outcome, read_all, Backend, Records};
use crate::common::*;

/// Mounts the filesystem under test read-only or read-write again.
fn set_read_only(backend: &mut Backend, read_only: bool) {
    match backend {
        Backend::Ext4 { dir, .. } => {
            let how = if read_only {
                "remount,ro"
            } else {
                "remount,rw"
            };
            run_ok(Command::new("mount").args(["-o", how]).arg(&*dir));
        }
        Backend::Verityfs(m) => {
            let mut args = vec!["-o", "allow_other"];
            if read_only {
                args.extend(["-o", "ro"]);
            }
            m.remount(&args);
        }
    }
}

/// Enable on `path` opened read-only (a directory too).
fn enable(path: &Path) -> String {
    match File::open(path) {
        Ok(file) => enable_on(&file, &EnableArg::default()),
        Err(e) => format!("open: {}", outcome::<()>(Err(e))),
    }
}

pub fn run_all(backend: &mut Backend) -> Records {
    let dir = backend.dir().join("read-only");
    fs::create_dir(&dir).unwrap();
    let (plain, verity, sub) = (dir.join("plain"), dir.join("verity"), dir.join("dir"));
    fs::write(&plain, random_bytes(20_000, 1)).unwrap();
    fs::write(&verity, random_bytes(20_000, 2)).unwrap();
    assert_eq!(enable(&verity), "ok");
    fs::create_dir(&sub).unwrap();
    set_read_only(backend, true);
    let mut records = Records::default();
    records.add("read-only/enable-plain", enable(&plain));
    records.add("read-only/enable-verity", enable(&verity));
    records.add("read-only/enable-dir", enable(&sub));
    let salt = EnableArg {
        salt: vec![1; 33],
        ..EnableArg::default()
    };
    let with_bad_salt = File::open(&plain).unwrap();
    records.add("read-only/enable-salt-33", enable_on(&with_bad_salt, &salt));
    drop(with_bad_salt);
    records.add("read-only/measure-verity", measure_on(&verity, 64));
    records.add("read-only/measure-plain", measure_on(&plain, 64));
    records.add("read-only/read-verity", read_all(&verity));
    let write = OpenOptions::new().write(true).clone();
    records.add("read-only/open-for-write", open_outcome(&plain, &write));
    set_read_only(backend, false);
    records
}
