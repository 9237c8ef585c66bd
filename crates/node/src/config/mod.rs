//! Configuration: what a start is told. The command line (`flags`: clap, and `Start`,
//! what one start needs of it) and `--config FILE` (`config_file`: a TOML file's keys
//! made flags before the command line's). Used by `main` alone; parses, starts nothing.
//!
//! ```text
//!   config_file ──▶ flags ──▶ data::datadev (DataDevice), process::tcp (its bounds)
//! ```

pub(crate) mod config_file;
pub(crate) mod flags;
