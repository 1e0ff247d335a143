//! The differences between ext4 under Linux and a verityfs mount that FUSE
//! makes unavoidable, each with the reason; every other difference is a
//! bug.

use super::Records;

/// A known difference: scenarios whose name matches `scenario` (`*`
/// matches anything) where the kernel gives `kernel` and the mount `fuse`
/// (`*`: any value).
pub struct Known {
    pub scenario: &'static str,
    pub kernel: &'static str,
    pub fuse: &'static str,
    pub why: &'static str,
}

pub const KNOWN: &[Known] = &[
    Known {
        scenario: "hostile/*[FUSE layer: ENOMEM]",
        kernel: "*",
        fuse: "ENOMEM",
        why: "the FUSE driver refuses a salt or signature of more than 256 pages, or a request \
              beyond the connection's max_pages, before the daemon sees the call",
    },
    Known {
        scenario: "hostile/*[FUSE layer: EFAULT]",
        kernel: "*",
        fuse: "EFAULT",
        why: "the FUSE driver copies the whole salt, signature or digest buffer before the \
              daemon sees the call, so an unreadable one fails first, where fs-verity checks \
              the arguments before copying them",
    },
    Known {
        scenario: "metadata-ioctl/*",
        kernel: "*",
        fuse: "ENOTTY",
        why: "FUSE does not forward FS_IOC_READ_VERITY_METADATA (fs/fuse/ioctl.c sets up no \
              output buffer for it), so the daemon answers ENOTTY; the same bytes are compared \
              through the library under params/*/metadata-*",
    },
    Known {
        scenario: "after/statx-attr-verity",
        kernel: "(true, true)",
        fuse: "(false, *)",
        why: "FUSE does not pass statx attributes (STATX_ATTR_VERITY) from the daemon",
    },
    Known {
        scenario: "ro-bind/*",
        kernel: "*",
        fuse: "ok*",
        why: "a FUSE ioctl does not say through which mount the file was opened, so the daemon \
              cannot refuse an enable through a read-only bind mount (EROFS); the measures \
              that follow see the file enabled",
    },
    Known {
        scenario: "params/*-bs8192-*",
        kernel: "*",
        fuse: "*",
        why: "by design verityfs takes Merkle tree blocks up to 64 KiB, as Linux does on \
              64 KiB-page systems; Linux on 4 KiB pages refuses blocks larger than the page \
              and the filesystem block (EINVAL)",
    },
    Known {
        scenario: "params/*-bs65536-*",
        kernel: "*",
        fuse: "*",
        why: "as for 8192-byte blocks",
    },
    Known {
        scenario: "hostile/*[block size above 4096]*",
        kernel: "EINVAL",
        fuse: "*",
        why: "as for params/*-bs8192-*",
    },
    Known {
        scenario: "enable-arg/plain/garbage-signature*",
        kernel: "EN*",
        fuse: "ok*",
        why: "by design verityfs without --trusted-cert stores signatures unchecked, as Linux \
              built without CONFIG_FS_VERITY_BUILTIN_SIGNATURES does; Debian's kernel has it \
              and refuses every signed file while its .fs-verity keyring is empty (ENOKEY)",
    },
    Known {
        scenario: "hostile/*[signature]",
        kernel: "ENOKEY",
        fuse: "ok",
        why: "as for enable-arg/plain/garbage-signature",
    },
];

/// Whether `text` matches `pattern`, where `*` matches any run of
/// characters.
fn matches(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, tail)) => {
            text.starts_with(head)
                && (0..=text.len() - head.len()).any(|i| {
                    text.is_char_boundary(head.len() + i) && matches(tail, &text[head.len() + i..])
                })
        }
    }
}

fn known(name: &str, kernel: &str, fuse: &str) -> Option<&'static Known> {
    KNOWN
        .iter()
        .find(|k| matches(k.scenario, name) && matches(k.kernel, kernel) && matches(k.fuse, fuse))
}

/// The comparison of a kernel run with a verityfs run.
#[derive(Default)]
pub struct Comparison {
    /// Differences the table explains: scenario, kernel, fuse, why.
    pub explained: Vec<String>,
    /// Every other difference.
    pub unexplained: Vec<String>,
    /// Table entries that matched nothing (out of date).
    pub unused: Vec<&'static str>,
}

pub fn compare(kernel: &Records, fuse: &Records) -> Comparison {
    let mut result = Comparison::default();
    let mut used = vec![false; KNOWN.len()];
    let names: std::collections::BTreeSet<&String> = kernel.0.keys().chain(fuse.0.keys()).collect();
    let missing = String::from("(not run)");
    for name in names {
        let k = kernel.0.get(name).unwrap_or(&missing);
        let f = fuse.0.get(name).unwrap_or(&missing);
        if k == f {
            continue;
        }
        match known(name, k, f) {
            Some(entry) => {
                used[KNOWN.iter().position(|e| std::ptr::eq(e, entry)).unwrap()] = true;
                result
                    .explained
                    .push(format!("{name}: Linux: {k} | verityfs: {f}: {}", entry.why));
            }
            None => result
                .unexplained
                .push(format!("{name}:\n    Linux:    {k}\n    verityfs: {f}")),
        }
    }
    result.unused = KNOWN
        .iter()
        .zip(used)
        .filter(|(_, used)| !used)
        .map(|(k, _)| k.scenario)
        .collect();
    result
}
