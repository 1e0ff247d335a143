//! The test files, made in `DIR/backing`: the same random bytes as a
//! verity file and as a plain file, and optionally a large sparse verity
//! file for the memory measurement.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use verityfs::{enable_verity, EnableRequest, FileState, MerkleTreeParams};

use super::measure::SplitMix64;
use super::{note, Context, Result};

/// Seed of the test data.
const DATA_SEED: u64 = 2019;
/// Write size while making the files.
const WRITE_CHUNK: usize = 1 << 20;

/// Names of the files inside the backing directory (and so in the mount).
pub const VERITY_NAME: &str = "verity.bin";
/// The plain (non-verity) copy.
pub const PLAIN_NAME: &str = "plain.bin";
/// The sparse verity file of `--huge`.
pub const HUGE_NAME: &str = "huge.bin";

/// The test files.
#[derive(Clone, Debug)]
pub struct TestFiles {
    /// The backing directory served by the mounts.
    pub backing: PathBuf,
    /// Size of the verity and plain files.
    pub size: u64,
}

impl TestFiles {
    /// The backing path of the file `name`.
    pub fn backing_path(&self, name: &str) -> PathBuf {
        self.backing.join(name)
    }

    /// Makes the files in `dir/backing`, replacing any left by an earlier run.
    pub fn create(dir: &Path, size: u64, huge: Option<u64>) -> Result<TestFiles> {
        let files = TestFiles {
            backing: dir.join("backing"),
            size,
        };
        std::fs::create_dir_all(&files.backing)
            .ctx(format!("can't create '{}'", files.backing.display()))?;
        note(format!(
            "writing {size} random bytes to {} and {}",
            VERITY_NAME, PLAIN_NAME
        ));
        let verity_path = files.backing_path(VERITY_NAME);
        let plain_path = files.backing_path(PLAIN_NAME);
        let mut verity = create_new(&verity_path)?;
        let mut plain = create_new(&plain_path)?;
        let mut rng = SplitMix64(DATA_SEED);
        let mut buf = vec![0u8; WRITE_CHUNK];
        let mut left = size;
        while left > 0 {
            let n = left.min(WRITE_CHUNK as u64) as usize;
            rng.fill(&mut buf[..n]);
            verity
                .write_all(&buf[..n])
                .ctx(format!("writing '{}'", verity_path.display()))?;
            plain
                .write_all(&buf[..n])
                .ctx(format!("writing '{}'", plain_path.display()))?;
            left -= n as u64;
        }
        plain
            .sync_all()
            .ctx(format!("syncing '{}'", plain_path.display()))?;
        enable(&verity, &verity_path)?;
        if let Some(huge) = huge {
            let path = files.backing_path(HUGE_NAME);
            if is_verity_of_size(&path, huge) {
                note(format!(
                    "reusing the {huge}-byte sparse verity file {HUGE_NAME}"
                ));
            } else {
                note(format!(
                    "making a {huge}-byte sparse verity file {HUGE_NAME} (hashes {huge} bytes of zeros)"
                ));
                let file = create_new(&path)?;
                file.set_len(huge)
                    .ctx(format!("can't extend '{}'", path.display()))?;
                enable(&file, &path)?;
            }
        }
        Ok(files)
    }

    /// Removes the files (not the huge one, which is slow to make and can
    /// be reused) and the backing directory if it is then empty.
    pub fn remove(&self) {
        for name in [VERITY_NAME, PLAIN_NAME] {
            let _ = std::fs::remove_file(self.backing_path(name));
        }
        let _ = std::fs::remove_dir(&self.backing);
    }
}

/// Creates `path` for reading and writing, replacing any old file.
fn create_new(path: &Path) -> Result<File> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).ctx(format!("can't remove '{}'", path.display())),
    }
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .ctx(format!("can't create '{}'", path.display()))
}

/// Enables verity with fsverity's defaults (SHA-256, 4 KiB blocks) through
/// the library, on the backing file directly.
fn enable(file: &File, path: &Path) -> Result<()> {
    enable_verity(
        file,
        EnableRequest {
            params: MerkleTreeParams::default(),
            signature: None,
            progress: &mut |_| true,
        },
    )
    .map(drop)
    .ctx(format!("can't enable verity on '{}'", path.display()))
}

/// Whether `path` is already a verity file of `size` data bytes.
fn is_verity_of_size(path: &Path, size: u64) -> bool {
    matches!(FileState::read_path(path), Ok(FileState::Verity(loc)) if loc.data_size == size)
}
