//! The known differences between ext4 under Linux and a verityfs mount,
//! each with its reason: what FUSE cannot pass on, and two deliberate
//! choices of verityfs (Merkle tree blocks up to 64 KiB, signatures stored
//! unchecked without `--trusted-cert`). Every other difference is a bug.

use super::Records;

/// A known difference: scenarios whose name matches `scenario` (`*`
/// matches anything, `|` separates alternatives) where the kernel gives
/// `kernel` and the mount `fuse` (`*`: any value).
pub struct Known {
    pub scenario: &'static str,
    pub kernel: &'static str,
    pub fuse: &'static str,
    pub why: &'static str,
}

/// Why Merkle tree blocks above 4 KiB differ.
const BIG_BLOCKS: &str = "by design verityfs takes Merkle tree blocks up to 64 KiB, as Linux \
                          does on 64 KiB-page systems; Linux on 4 KiB pages refuses blocks larger \
                          than the page and the filesystem block (EINVAL)";

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
        scenario: "params/*-bs8192-*|params/*-bs65536-*",
        kernel: "EINVAL",
        fuse: "ok, ok *, the library's",
        why: BIG_BLOCKS,
    },
    Known {
        scenario: "params/*-bs8192-*/contents|params/*-bs65536-*/contents",
        kernel: "(not run)",
        fuse: "ok, read back",
        why: BIG_BLOCKS,
    },
    Known {
        scenario: "params/*-bs8192-*/metadata-signature-*|params/*-bs65536-*/metadata-signature-*",
        kernel: "(not run)",
        fuse: "ENODATA",
        why: BIG_BLOCKS,
    },
    Known {
        scenario: "params/*-bs8192-*/metadata-*|params/*-bs65536-*/metadata-*",
        kernel: "(not run)",
        fuse: "* bytes, identical to the library's and verityfs digest's",
        why: BIG_BLOCKS,
    },
    Known {
        scenario: "hostile/*[block size above 4096]*",
        kernel: "EINVAL",
        fuse: "*",
        why: BIG_BLOCKS,
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
    KNOWN.iter().find(|k| {
        k.scenario.split('|').any(|s| matches(s, name))
            && matches(k.kernel, kernel)
            && matches(k.fuse, fuse)
    })
}

/// The comparison of a kernel run with a verityfs run.
#[derive(Default)]
pub struct Comparison {
    /// One line per table entry that explained differences: how many, an
    /// example, why.
    pub explained: Vec<String>,
    /// Every other difference.
    pub unexplained: Vec<String>,
    /// Table entries that matched nothing (out of date).
    pub unused: Vec<&'static str>,
}

pub fn compare(kernel: &Records, fuse: &Records) -> Comparison {
    let mut result = Comparison::default();
    // Per table entry: how many differences it explained, the first one.
    let mut seen: Vec<(usize, String)> = vec![(0, String::new()); KNOWN.len()];
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
                let (count, example) =
                    &mut seen[KNOWN.iter().position(|e| std::ptr::eq(e, entry)).unwrap()];
                if *count == 0 {
                    *example = format!("{name}: Linux: {k} | verityfs: {f}");
                }
                *count += 1;
            }
            None => result
                .unexplained
                .push(format!("{name}:\n    Linux:    {k}\n    verityfs: {f}")),
        }
    }
    for (entry, (count, example)) in KNOWN.iter().zip(seen) {
        if count == 0 {
            result.unused.push(entry.scenario);
        } else {
            result.explained.push(format!(
                "{count} x {}: {}\n      e.g. {example}",
                entry.scenario, entry.why
            ));
        }
    }
    result
}
