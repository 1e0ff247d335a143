//! The hostile-ioctl generator's calls (`tests/hostile`) as oracle
//! scenarios: its boundary sweep and a seeded random batch, on a plain
//! file, verity files and a directory. Each call is recorded with the case
//! and tags for the known differences (see `known`): `[FUSE layer: ERRNO]`
//! where the kernel's FUSE driver answers before any daemon could,
//! `[signature]` and `[block size above 4096]`. Which file a call goes to
//! never depends on earlier results, so one difference does not shift
//! every later call.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use fastrand::Rng;

use super::{errno_name, Records};
use crate::common::*;
use crate::hostile::*;

/// The seed of the batch (both runs must use the same).
const SEED: u64 = 0x6f72_6163_6c65;
/// Random calls after the sweep.
const RANDOM_CALLS: usize = 1500;

struct Target {
    path: PathBuf,
    file: File,
}

impl Target {
    fn open(path: PathBuf) -> Target {
        let file = File::open(&path).unwrap();
        Target { path, file }
    }
}

struct Batch {
    dir: PathBuf,
    limits: Limits,
    ammo: Ammo,
    plain: Target,
    verity: Vec<Target>,
    directory: Target,
    files: u64,
    records: Records,
    calls: usize,
}

/// Runs the sweep and the random calls in a new directory of `dir`.
pub fn run(dir: &Path) -> Records {
    let dir = dir.join("hostile");
    fs::create_dir(&dir).unwrap();
    fs::create_dir(dir.join("dir")).unwrap();
    // The same limits as `hostile_ioctl.rs` sees on a mount here: the
    // case sizes derive from them and must not differ between the runs.
    let limits = Limits::of_this_kernel();
    let mut batch = Batch {
        ammo: Ammo::new(&limits, SEED),
        limits,
        plain: Target::open(dir.join("dir")),
        verity: Vec::new(),
        directory: Target::open(dir.join("dir")),
        files: 0,
        records: Records::default(),
        calls: 0,
        dir,
    };
    batch.plain = batch.new_plain();
    for (alg, block_size, salt) in VERITY_TARGETS {
        let target = batch.new_plain();
        let arg = EnableArg {
            hash_algorithm: alg,
            block_size,
            salt: salt.to_vec(),
            ..EnableArg::default()
        };
        verity_ioctl(&target.file, VerityIoctl::Enable(&arg)).unwrap();
        batch.verity.push(target);
    }
    let (enables, measures) = sweep(&batch.limits);
    let mut rng = Rng::with_seed(SEED);
    for case in enables {
        batch.enable(case, rng.u64(..));
    }
    for case in measures {
        batch.measure(case, rng.u64(..));
    }
    for _ in 0..RANDOM_CALLS {
        if rng.percent(60) {
            let case = random_enable(&mut rng, &batch.limits);
            batch.enable(case, rng.u64(..));
        } else {
            let case = random_measure(&mut rng);
            batch.measure(case, rng.u64(..));
        }
    }
    batch.records
}

impl Batch {
    fn new_plain(&mut self) -> Target {
        self.files += 1;
        let sizes = [0, 1, 4096, 4097, 10_000, 65_536, 100_000];
        let size = sizes[(self.files % sizes.len() as u64) as usize];
        let path = self.dir.join(format!("f{}", self.files));
        fs::write(&path, random_bytes(size, self.files)).unwrap();
        Target::open(path)
    }

    fn target(&self, kind: Kind, pick: u64) -> &Target {
        match kind {
            Kind::Plain => &self.plain,
            Kind::Verity => &self.verity[(pick % self.verity.len() as u64) as usize],
            Kind::Dir => &self.directory,
        }
    }

    fn record(&mut self, what: String, result: String) {
        self.calls += 1;
        self.records
            .add(format!("hostile/{:05} {what}", self.calls), result);
    }

    fn enable(&mut self, case: EnableCase, pick: u64) {
        let file = self.target(case.target, pick).file.try_clone().unwrap();
        let (got, _) = self.ammo.enable(&file, &case);
        let result = got.map_or_else(errno_name, |()| "ok".into());
        let mut tags = String::new();
        if let Some(errno) = fuse_layer_enable(&case, &self.limits) {
            tags = format!(" [FUSE layer: {}]", errno_name(errno));
        } else if (8192..=65536).contains(&case.block_size) && case.block_size.is_power_of_two() {
            tags = " [block size above 4096]".into();
        } else if case.sig_size > 0 {
            tags = " [signature]".into();
        }
        self.record(format!("enable {case:?}{tags}"), result);
        if case.target == Kind::Plain {
            // It may be verity now (on one side only): a fresh one.
            self.plain = self.new_plain();
        }
    }

    fn measure(&mut self, case: MeasureCase, pick: u64) {
        let target = self.target(case.target, pick);
        let name = target
            .path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let file = target.file.try_clone().unwrap();
        let result = match self.ammo.measure(&file, &case) {
            Ok(out) => format!("ok {}", format_digest(&out).unwrap_or_default()),
            Err(e) => errno_name(e),
        };
        let tag = fuse_layer_measure(&case, &self.limits).map_or(String::new(), |e| {
            format!(" [FUSE layer: {}]", errno_name(e))
        });
        self.record(format!("measure {case:?} of {name}{tag}"), result);
    }
}
