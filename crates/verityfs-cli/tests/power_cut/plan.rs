//! What the host and the guest exchange through the shared directory, as
//! lines of text: the plan of a cut (files to write and enable, an appended
//! log), the guest's acknowledgements (what it was told is durable) and its
//! report on what it found after the cut.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use fastrand::Rng;

use crate::common::{random_bytes, Draw};

/// The plan of the next cut, written by the host.
pub const PLAN: &str = "plan";
/// The plan of the cut to check, with its acknowledgements.
pub const CHECK_PLAN: &str = "check.plan";
pub const CHECK_ACKS: &str = "check.acks";
/// What the guest acknowledged during the current cut.
pub const ACKS: &str = "acks";
/// The guest's findings about the checked cut.
pub const REPORT: &str = "report";

/// The most a log file can grow: its bytes are the first bytes of one
/// pseudo-random stream.
pub const LOG_MAX: usize = 8 << 20;

/// A file written through the mount, fsynced, then enabled.
#[derive(Clone, Debug)]
pub struct VerityFile {
    pub name: String,
    pub size: usize,
    pub seed: u64,
    pub hash_alg: String,
    pub block_size: u32,
    /// Hexadecimal, empty for none.
    pub salt: String,
    /// `ALG:HEX` from `fsverity digest` of the data on the host.
    pub digest: String,
}

impl VerityFile {
    pub fn data(&self) -> Vec<u8> {
        random_bytes(self.size, self.seed)
    }

    /// The tree parameters as `fsverity` options.
    pub fn params(&self) -> Vec<String> {
        let mut params = vec![
            format!("--hash-alg={}", self.hash_alg),
            format!("--block-size={}", self.block_size),
        ];
        if !self.salt.is_empty() {
            params.push(format!("--salt={}", self.salt));
        }
        params
    }
}

/// One cut's work.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub files: Vec<VerityFile>,
    /// A file appended to and fsynced meanwhile, and its stream's seed.
    pub log: Option<(String, u64)>,
    /// The longest pause between two steps (idle time after an
    /// acknowledgement is when unsynced metadata would be lost: up to
    /// ext4's commit interval and past it).
    pub max_pause_ms: u64,
    /// The step after which the host's countdown to the cut starts: `2i`
    /// before writing file `i`, `2i + 1` before enabling it, `2n` once all
    /// are enabled.
    pub cut_step: usize,
}

impl Plan {
    /// A random plan; `digest` gives `fsverity digest` of a file's data.
    pub fn random(rng: &mut Rng, cut: usize, digest: impl Fn(&VerityFile) -> String) -> Plan {
        let count = 2 + rng.usize(..2);
        let files: Vec<VerityFile> = (0..count)
            .map(|i| {
                // 1 byte to 64 MiB, mostly small, rarely a multiple of a
                // block. Files read whole at open (under 1 MiB with their
                // metadata) have their blocks moved together after the
                // enable: a quarter are under 64 KiB, so that cuts land
                // there too.
                let size = match rng.percent(25) {
                    true => 1 + rng.usize(..64 << 10),
                    false => {
                        (1usize << (20 + rng.pick(&[0, 0, 0, 1, 1, 2, 3, 4, 6])))
                            - rng.usize(..1 << 19)
                    }
                };
                let salt_len = rng.pick(&[0, 0, 1, 16, 32]);
                let salt = (0..salt_len).fold(String::new(), |mut s, _| {
                    let _ = write!(s, "{:02x}", rng.u8(..));
                    s
                });
                let mut file = VerityFile {
                    name: format!("c{cut}-f{i}"),
                    size,
                    seed: rng.u64(..),
                    hash_alg: rng.pick(&["sha256", "sha256", "sha512"]).to_owned(),
                    block_size: rng.pick(&[4096, 4096, 1024, 2048]),
                    salt,
                    digest: String::new(),
                };
                file.digest = digest(&file);
                file
            })
            .collect();
        let log = rng
            .percent(40)
            .then(|| (format!("c{cut}-log"), rng.u64(..)));
        Plan {
            cut_step: rng.usize(..=2 * files.len()),
            files,
            log,
            max_pause_ms: rng.pick(&[0, 500, 2000, 6000]),
        }
    }

    pub fn encode(&self) -> String {
        let mut out = format!("pause {}\ncut {}\n", self.max_pause_ms, self.cut_step);
        for f in &self.files {
            let salt = if f.salt.is_empty() { "-" } else { &f.salt };
            let _ = writeln!(
                out,
                "file {} {} {} {} {} {salt} {}",
                f.name, f.size, f.seed, f.hash_alg, f.block_size, f.digest
            );
        }
        if let Some((name, seed)) = &self.log {
            let _ = writeln!(out, "log {name} {seed}");
        }
        out
    }

    pub fn decode(text: &str) -> Plan {
        let mut plan = Plan::default();
        for line in text.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w[..] {
                ["pause", ms] => plan.max_pause_ms = ms.parse().unwrap(),
                ["cut", step] => plan.cut_step = step.parse().unwrap(),
                ["file", name, size, seed, alg, block, salt, digest] => {
                    plan.files.push(VerityFile {
                        name: name.to_owned(),
                        size: size.parse().unwrap(),
                        seed: seed.parse().unwrap(),
                        hash_alg: alg.to_owned(),
                        block_size: block.parse().unwrap(),
                        salt: if salt == "-" { "" } else { salt }.to_owned(),
                        digest: digest.to_owned(),
                    })
                }
                ["log", name, seed] => plan.log = Some((name.to_owned(), seed.parse().unwrap())),
                _ => panic!("bad plan line {line:?}"),
            }
        }
        plan
    }

    pub fn read(path: &Path) -> Plan {
        Plan::decode(&fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}")))
    }
}

/// What the guest acknowledged before the cut: each line is `SECS WHAT
/// NAME [LEN]`, SECS counted from the start of the workload.
#[derive(Debug, Default)]
pub struct Acks {
    pub synced: Vec<String>,
    pub enabled: Vec<String>,
    /// The log's length as of its last acknowledged fsync.
    pub log_len: usize,
}

impl Acks {
    pub fn decode(text: &str) -> Acks {
        let mut acks = Acks::default();
        // The last line may be torn by the cut: only whole lines count.
        let whole = text.rfind('\n').map_or("", |end| &text[..end]);
        for line in whole.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w[1..] {
                ["synced", name] => acks.synced.push(name.to_owned()),
                ["enabled", name] => acks.enabled.push(name.to_owned()),
                ["appended", _, len] => acks.log_len = len.parse().unwrap(),
                ["done"] => {}
                _ => panic!("bad acknowledgement {line:?}"),
            }
        }
        acks
    }
}

/// The stream whose first bytes a log file holds.
pub fn log_stream(seed: u64) -> Vec<u8> {
    random_bytes(LOG_MAX, seed)
}
