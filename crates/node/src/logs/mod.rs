//! The node's own log lines: the `tracing` layer that puts every line into a bounded
//! ring and the rotated file `ROOT/data/log/node.log` (`logcapture`), read back by the
//! log server (`runnables::logserver`). Imports nothing else of this crate.
//!
//! ```text
//!   logcapture      the tracing layer: every line → ring + rotated file (LogHub)
//!     └──▶ logfile      ROOT/data/log/node.log, rotated; read back after a restart
//!            └──▶ logring   the bounded ring and its readers' rules (pure)
//! ```

pub(crate) mod logcapture;
pub(crate) mod logfile;
pub(crate) mod logring;
