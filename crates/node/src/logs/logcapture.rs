//! The node's own log lines, kept for `NodeLogs`: a `tracing` layer (next to the stderr
//! output, behind the same POLIS_LOG filter) that puts every line, tagged with the DN of
//! the supervisor runnable it came from, into one process-wide [`LogHub`]: a bounded
//! ring ([`RING_LINES`] lines of at most [`MAX_TEXT`] bytes) and, once the root is
//! known, the rotated file (`logfile`), whose last lines refill the ring on start.
//!
//! May not log (it is the logger) nor block on anything but its own mutex.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use crate::logs::logfile::{self, RotatingFile};
use crate::logs::logring::{LineFilter, LogLine, Ring};

/// Lines kept in memory.
pub const RING_LINES: usize = 10_000;
/// Longest text kept of one line, in bytes (the rest is cut): with [`RING_LINES`], the
/// ring's memory bound.
pub const MAX_TEXT: usize = 2048;

struct Inner {
    ring: Ring,
    file: Option<RotatingFile>,
}

/// The ring, the file and a wake-up for followers.
pub struct LogHub {
    inner: Mutex<Inner>,
    pub changed: tokio::sync::Notify,
}

/// The process's hub.
pub fn hub() -> &'static LogHub {
    static HUB: OnceLock<LogHub> = OnceLock::new();
    HUB.get_or_init(|| LogHub {
        inner: Mutex::new(Inner {
            ring: Ring::new(RING_LINES),
            file: None,
        }),
        changed: tokio::sync::Notify::new(),
    })
}

impl LogHub {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding it cannot leave the ring inconsistent (push is whole).
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn push(&self, line: LogLine) {
        {
            let mut inner = self.lock();
            if let Some(file) = inner.file.as_mut() {
                // A full disk must not stop the node: the line stays in memory.
                let _ = file.write_line(&line);
            }
            inner.ring.push(line);
        }
        self.changed.notify_waiters();
    }

    /// Starts writing `ROOT/data/log/node.log`; the ring is refilled with the file's
    /// last lines first (lines of earlier runs), then this run's so far.
    pub fn attach_file(&self, root: &Path) -> std::io::Result<()> {
        let dir = logfile::log_dir(root);
        let earlier = logfile::read_tail(&dir, RING_LINES);
        let mut file = RotatingFile::open(&dir, logfile::ROTATE_BYTES)?;
        let mut inner = self.lock();
        let this_run = inner.ring.last(0, &LineFilter::default());
        let mut ring = Ring::new(RING_LINES);
        for line in earlier {
            ring.push(line);
        }
        for line in this_run {
            let _ = file.write_line(&line);
            ring.push(line);
        }
        inner.ring = ring;
        inner.file = Some(file);
        Ok(())
    }

    /// Stops writing the log file (lines stay in memory): the data file system it is on
    /// is about to be unmounted.
    pub fn detach_file(&self) {
        self.lock().file = None;
    }

    /// The last `n` lines matching `filter` (0: all) and the sequence after them.
    pub fn last(&self, n: usize, filter: &LineFilter) -> (Vec<LogLine>, u64) {
        let inner = self.lock();
        (inner.ring.last(n, filter), inner.ring.next_sequence())
    }

    /// See [`Ring::read_from`].
    pub fn read_from(
        &self,
        from: u64,
        max: usize,
        filter: &LineFilter,
    ) -> (u64, Vec<LogLine>, u64) {
        self.lock().ring.read_from(from, max, filter)
    }
}

/// The runnable DN a span carries (supervisor's `runnable` span, field `dn`).
struct Dn(String);

#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
    dn: Option<String>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => {
                let _ = write!(self.message, "{value:?}");
            }
            "dn" => self.dn = Some(format!("{value:?}")),
            name => {
                let _ = write!(self.rest, " {name}={value:?}");
            }
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message.push_str(value),
            "dn" => self.dn = Some(value.to_string()),
            name => {
                let _ = write!(self.rest, " {name}={value}");
            }
        }
    }
}

/// The layer: see the module documentation.
pub struct CaptureLayer;

impl<S> tracing_subscriber::Layer<S> for CaptureLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let (Some(dn), Some(span)) = (fields.dn, ctx.span(id)) {
            span.extensions_mut().insert(Dn(dn));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let runnable = ctx
            .event_scope(event)
            .and_then(|scope| {
                scope
                    .into_iter()
                    .find_map(|span| span.extensions().get::<Dn>().map(|d| d.0.clone()))
            })
            .unwrap_or_default();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut text = fields.message;
        text.push_str(&fields.rest);
        if text.len() > MAX_TEXT {
            let mut cut = MAX_TEXT;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push('…');
        }
        let metadata = event.metadata();
        hub().push(LogLine {
            sequence: 0,
            time_unix_micros: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_micros() as u64)
                .unwrap_or(0),
            level: metadata.level().to_string(),
            runnable,
            target: metadata.target().to_string(),
            text,
        });
    }
}
