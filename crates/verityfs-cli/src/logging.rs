//! Where the daemon's messages go and how they look.
//!
//! * stderr, a terminal: `tracing`'s usual format, in colour;
//! * stderr, anything else (a file, a pipe): the same without colour codes;
//! * stderr connected to the journal (systemd sets `JOURNAL_STREAM` to its
//!   device and inode): one `<N>message` line per event, `N` the syslog
//!   priority, which journald strips and stores (`journalctl -p warning`);
//! * `VERITYFS_LOG=syslog[:SOCKET]`: one datagram per event to the syslog
//!   socket (`/dev/log`, which journald also serves), facility `daemon`,
//!   as the mount(8) helper asks for; stderr if the socket cannot be used.
//!
//! The same message repeated within [`REPEAT_WINDOW`] is logged once: the
//! kernel retries a failed read once or twice (readahead, then the page
//! itself), and each retry would report the same corruption again.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::{self, IsTerminal, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{Format, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

/// A message repeated within this time after it was logged is dropped.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(5);

/// Messages remembered for [`REPEAT_WINDOW`].
const REMEMBERED: usize = 64;

/// The syslog socket used when `VERITYFS_LOG=syslog` names none.
const SYSLOG_SOCKET: &str = "/dev/log";

/// Logs to stderr (or syslog) through `tracing`, filtered by `RUST_LOG`
/// (default: warnings and errors only, so nothing is printed on the happy
/// path; fuser warns about routine events such as being unmounted from
/// outside).
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,fuser=error"));
    let (style, sink) = destination();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(style == Style::Terminal)
        .event_format(LineFormat {
            style,
            recent: Mutex::default(),
        })
        .with_writer(sink)
        .init();
}

/// How events are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Style {
    /// `tracing`'s format, in colour.
    Terminal,
    /// `tracing`'s format, plain.
    Plain,
    /// `<N>message`, for journald's stream parser.
    Journal,
    /// `<PRI>verityfs[PID]: message`, one datagram each.
    Syslog,
}

/// The style and the writer the environment asks for.
fn destination() -> (Style, Sink) {
    if let Ok(spec) = std::env::var("VERITYFS_LOG") {
        let path = match spec.as_str() {
            "syslog" => Some(SYSLOG_SOCKET),
            _ => spec.strip_prefix("syslog:"),
        };
        if let Some(path) = path {
            let socket = UnixDatagram::unbound().and_then(|s| s.connect(path).map(|()| s));
            match socket {
                Ok(socket) => return (Style::Syslog, Sink::Syslog(Arc::new(socket))),
                Err(e) => eprintln!("verityfs: cannot log to {path} ({e}): logging to stderr"),
            }
        }
    }
    let stderr = io::stderr();
    let style = if stderr.is_terminal() {
        Style::Terminal
    } else if stderr_is_journal() {
        Style::Journal
    } else {
        Style::Plain
    };
    (style, Sink::Stderr)
}

/// True if stderr is connected to the journal (checked once).
pub fn stderr_is_journal() -> bool {
    static JOURNAL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *JOURNAL.get_or_init(|| is_journal(&io::stderr()))
}

/// True if `JOURNAL_STREAM` (`DEVICE:INODE`) names this stderr: systemd
/// sets it when connecting a service's output to the journal, and it is
/// inherited by children whose stderr may be something else.
fn is_journal(stderr: &impl AsFd) -> bool {
    let Ok(value) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(st) = rustix::fs::fstat(stderr) else {
        return false;
    };
    value == format!("{}:{}", st.st_dev, st.st_ino)
}

/// The syslog severity of a level (RFC 5424; also the `<N>` of sd-daemon).
fn severity(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// The syslog facility `daemon`, shifted into a priority.
const FACILITY_DAEMON: u8 = 3 << 3;

/// Formats events in a [`Style`], dropping repeats.
struct LineFormat {
    style: Style,
    recent: Mutex<VecDeque<(String, Instant)>>,
}

impl LineFormat {
    /// True if `message` was not logged within [`REPEAT_WINDOW`]; records
    /// it as logged now if so.
    fn first_time(&self, message: &str) -> bool {
        let now = Instant::now();
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.retain(|(_, at)| now.duration_since(*at) < REPEAT_WINDOW);
        if recent.iter().any(|(m, _)| m == message) {
            return false;
        }
        if recent.len() == REMEMBERED {
            recent.pop_front();
        }
        recent.push_back((message.to_owned(), now));
        true
    }
}

impl<S, N> FormatEvent<S, N> for LineFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut text = Text::default();
        event.record(&mut text);
        let level = event.metadata().level();
        if !self.first_time(&format!("{level} {}", text.0)) {
            return Ok(());
        }
        match self.style {
            Style::Terminal | Style::Plain => Format::default().format_event(ctx, writer, event),
            Style::Journal => writeln!(writer, "<{}>{}", severity(level), text.0),
            Style::Syslog => {
                let priority = FACILITY_DAEMON | severity(level);
                let pid = std::process::id();
                write!(writer, "<{priority}>verityfs[{pid}]: {}", text.0)
            }
        }
    }
}

/// An event's message and other fields, as `message key=value...`.
#[derive(Default)]
struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let sep = if self.0.is_empty() { "" } else { " " };
        let _ = match field.name() {
            "message" => write!(self.0, "{sep}{value:?}"),
            name => write!(self.0, "{sep}{name}={value:?}"),
        };
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.0.push_str(value),
            _ => self.record_debug(field, &value),
        }
    }
}

/// Where formatted events go.
#[derive(Clone)]
enum Sink {
    Stderr,
    Syslog(Arc<UnixDatagram>),
}

impl<'a> MakeWriter<'a> for Sink {
    type Writer = Self;

    fn make_writer(&'a self) -> Self {
        self.clone()
    }
}

impl Write for Sink {
    /// One event per call (the formatter writes an event at once): a
    /// datagram for syslog, falling back to stderr if the socket fails.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Sink::Syslog(socket) = self {
            if buf.is_empty() || socket.send(buf).is_ok() {
                return Ok(buf.len());
            }
        }
        io::stderr().write_all(buf)?;
        if matches!(self, Sink::Syslog(_)) && !buf.ends_with(b"\n") {
            io::stderr().write_all(b"\n")?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}
