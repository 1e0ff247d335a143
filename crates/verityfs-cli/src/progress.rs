//! Progress bars on stderr for long work, only when stderr is a terminal.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// Files smaller than this finish too fast to deserve a bar.
const MIN_BYTES_FOR_BAR: u64 = 64 << 20;

/// A byte-count progress bar for `total` bytes of `what`, or a hidden one
/// when stderr is not a terminal or the work is small.
pub fn bytes_bar(total: u64, what: &str) -> ProgressBar {
    if total < MIN_BYTES_FOR_BAR || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
    )
    .expect("template is valid")
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_owned());
    bar
}
