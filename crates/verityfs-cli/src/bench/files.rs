//! The test files, made in a backing directory: every file twice with the
//! same random bytes, once under `plain/` and once under `verity/` (where
//! verity is enabled), so that each workload reads the same bytes from
//! either; optionally a large sparse verity file for the memory measurement.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use verityfs::{enable_verity, EnableRequest, MerkleTreeParams};

use super::workloads::Workload;
use super::{check_interrupted, note, Config, Context, Result};

/// Seed of the test data.
const DATA_SEED: u64 = 2019;
/// Write size while making the files.
const WRITE_CHUNK: usize = 1 << 20;

/// Size of each small file.
pub const SMALL_FILE_SIZE: u64 = 16 << 10;
/// Number of stream files: enough for the widest parallel workload.
pub const STREAMS: usize = 16;
/// A stream file is this fraction of `--size`, so that 16 streams read
/// twice the large file's bytes.
const STREAM_DIVISOR: u64 = 8;

/// The directory of the plain copies inside the backing directory (and so
/// inside the mount).
pub const PLAIN_DIR: &str = "plain";
/// The directory of the verity copies.
pub const VERITY_DIR: &str = "verity";
/// The sparse verity file of `--huge`, inside [`VERITY_DIR`].
pub const HUGE_NAME: &str = "huge.bin";

/// The large file inside a plain or verity directory `root`.
pub fn large(root: &Path) -> PathBuf {
    root.join("large.bin")
}

/// Small file `i` inside `root`.
pub fn small(root: &Path, i: usize) -> PathBuf {
    root.join("small").join(format!("{i:05}"))
}

/// Stream file `i` inside `root`.
pub fn stream(root: &Path, i: usize) -> PathBuf {
    root.join("streams").join(format!("{i:02}.bin"))
}

/// The sizes of the test files.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// The large file.
    pub large: u64,
    /// Number of small files.
    pub files: usize,
    /// Each stream file.
    pub stream: u64,
    /// The sparse file, if any.
    pub huge: Option<u64>,
}

impl Sizes {
    /// The sizes `config` asks for; files that none of its workloads read
    /// are left empty, or not made.
    pub fn of(config: &Config) -> Sizes {
        fn streams(w: &Workload) -> bool {
            matches!(w, Workload::Parallel4 | Workload::Parallel16)
        }
        let uses = |reads: fn(&Workload) -> bool| config.workloads.iter().any(reads);
        Sizes {
            large: match uses(|w| *w != Workload::Small && !streams(w)) {
                true => config.size,
                false => 0,
            },
            files: match uses(|w| *w == Workload::Small) {
                true => config.files,
                false => 0,
            },
            stream: match uses(streams) {
                true => (config.size / STREAM_DIVISOR).max(SMALL_FILE_SIZE),
                false => 0,
            },
            huge: config.huge,
        }
    }

    /// Bytes of data in the plain and verity copies together.
    pub fn data_bytes(&self) -> u64 {
        2 * (self.large + self.files as u64 * SMALL_FILE_SIZE + STREAMS as u64 * self.stream)
    }

    /// A generous size for a filesystem holding the files: the data, Merkle
    /// trees (under 1/127 of the data with 4 KiB blocks), one block of
    /// slack per file, and room for ext4's own metadata and journal.
    pub fn filesystem_bytes(&self) -> u64 {
        let data = self.data_bytes();
        let files = 2 * (self.files + STREAMS + 1) as u64;
        let huge_tree = self.huge.map_or(0, |h| h / 100);
        data + data / 50 + files * 8192 + huge_tree + (256 << 20)
    }
}

/// The test files.
#[derive(Clone, Debug)]
pub struct TestFiles {
    /// The backing directory served by the mounts.
    pub backing: PathBuf,
    /// Their sizes.
    pub sizes: Sizes,
}

impl TestFiles {
    /// The plain copies in the backing directory.
    pub fn plain(&self) -> PathBuf {
        self.backing.join(PLAIN_DIR)
    }

    /// The verity copies in the backing directory.
    pub fn verity(&self) -> PathBuf {
        self.backing.join(VERITY_DIR)
    }

    /// Makes the files in `backing` (made if needed).
    pub fn create(backing: &Path, sizes: Sizes) -> Result<TestFiles> {
        let files = TestFiles {
            backing: backing.to_owned(),
            sizes,
        };
        for root in [files.plain(), files.verity()] {
            for sub in ["small", "streams"] {
                let dir = root.join(sub);
                std::fs::create_dir_all(&dir).ctx(format!("can't create '{}'", dir.display()))?;
            }
        }
        note(format!(
            "writing {} MB of random test data to {}",
            sizes.data_bytes() / 1_000_000,
            backing.display()
        ));
        let mut maker = Maker {
            files: &files,
            rng: fastrand::Rng::with_seed(DATA_SEED),
            buf: vec![0u8; WRITE_CHUNK],
        };
        maker.pair(large, sizes.large)?;
        for i in (0..STREAMS).filter(|_| sizes.stream > 0) {
            maker.pair(|root| stream(root, i), sizes.stream)?;
        }
        for i in 0..sizes.files {
            maker.pair(|root| small(root, i), SMALL_FILE_SIZE)?;
        }
        if let Some(huge) = sizes.huge {
            note(format!(
                "making a {huge}-byte sparse verity file {HUGE_NAME} (hashes {huge} bytes of zeros)"
            ));
            let path = files.verity().join(HUGE_NAME);
            let file = create(&path)?;
            file.set_len(huge)
                .ctx(format!("can't extend '{}'", path.display()))?;
            enable(&file, &path)?;
        }
        // The data goes to the disk now,
        // not during a measurement.
        rustix::fs::sync();
        Ok(files)
    }
}

/// Writes the test files.
struct Maker<'a> {
    files: &'a TestFiles,
    rng: fastrand::Rng,
    buf: Vec<u8>,
}

impl Maker<'_> {
    /// Writes `len` random bytes to the plain and the verity copy of the
    /// file that `name` places in a root, and enables verity on the latter.
    fn pair(&mut self, name: impl Fn(&Path) -> PathBuf, len: u64) -> Result<()> {
        check_interrupted()?;
        let plain_path = name(&self.files.plain());
        let verity_path = name(&self.files.verity());
        let mut plain = create(&plain_path)?;
        let mut verity = create(&verity_path)?;
        let mut left = len;
        while left > 0 {
            let n = left.min(WRITE_CHUNK as u64) as usize;
            self.rng.fill(&mut self.buf[..n]);
            plain
                .write_all(&self.buf[..n])
                .ctx(format!("writing '{}'", plain_path.display()))?;
            verity
                .write_all(&self.buf[..n])
                .ctx(format!("writing '{}'", verity_path.display()))?;
            left -= n as u64;
        }
        enable(&verity, &verity_path)
    }
}

/// Creates `path` for reading and writing; it must not exist.
fn create(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .ctx(format!("can't create '{}'", path.display()))
}

/// Enables verity with fsverity's defaults (SHA-256, 4 KiB blocks) through
/// the library, on the backing file directly, and lays the file out on the
/// disk as a mount's enable does.
fn enable(file: &File, path: &Path) -> Result<()> {
    enable_verity(
        file,
        EnableRequest {
            params: MerkleTreeParams::default(),
            signature: None,
            progress: &mut |_| true,
        },
    )
    .ctx(format!("can't enable verity on '{}'", path.display()))?;
    crate::cmd_enable::place_together(file, path);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_files_the_workloads_read() {
        let config = |workloads| Config {
            dir: "/x".into(),
            size: 8 << 20,
            files: 10,
            reads: 1,
            runs: 1,
            workloads,
            dir_device: false,
            json: "/x/bench.json".into(),
            chart: "/x/bench.png".into(),
            huge: None,
        };
        let s = Sizes::of(&config(vec![Workload::Small]));
        assert_eq!((s.large, s.files, s.stream), (0, 10, 0));
        let s = Sizes::of(&config(vec![Workload::Parallel4, Workload::Warm]));
        assert_eq!((s.large, s.files, s.stream), (8 << 20, 0, 1 << 20));
    }

    #[test]
    fn filesystem_holds_the_data_with_room() {
        let sizes = Sizes {
            large: 200_000_000,
            files: 2000,
            stream: 25_000_000,
            huge: None,
        };
        assert_eq!(
            sizes.data_bytes(),
            2 * (200_000_000 + 2000 * 16384 + 16 * 25_000_000)
        );
        assert!(sizes.filesystem_bytes() > sizes.data_bytes() * 101 / 100 + (200 << 20));
    }
}
