//! The node's log file: `ROOT/data/log/node.log`, one JSON object per line, 0600,
//! rotated to `node.log.1` once it would pass a size (so at most two files, about
//! twice that size, ever exist); and reading the last lines back after a restart.
//!
//! May not keep lines in memory beyond one read-back (`logring` does).

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::logs::logring::LogLine;

/// Size past which `node.log` is rotated.
pub const ROTATE_BYTES: u64 = 8 << 20;

/// The log directory inside a node root.
pub fn log_dir(root: &Path) -> PathBuf {
    root.join("data").join("log")
}

/// An open, rotated log file.
#[derive(Debug)]
pub struct RotatingFile {
    path: PathBuf,
    file: File,
    size: u64,
    limit: u64,
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

impl RotatingFile {
    /// Opens (creates) `dir/node.log`, the directory 0700.
    pub fn open(dir: &Path, limit: u64) -> std::io::Result<RotatingFile> {
        privatefs::ensure_private_dir(dir).map_err(std::io::Error::other)?;
        let path = dir.join("node.log");
        let file = open_append(&path)?;
        let size = file.metadata()?.len();
        Ok(RotatingFile {
            path,
            file,
            size,
            limit,
        })
    }

    /// Appends one line, rotating first if it would pass the limit.
    pub fn write_line(&mut self, line: &LogLine) -> std::io::Result<()> {
        let mut text = serde_json::json!({
            "t": line.time_unix_micros,
            "l": line.level,
            "r": line.runnable,
            "g": line.target,
            "m": line.text,
        })
        .to_string();
        text.push('\n');
        if self.size > 0 && self.size + text.len() as u64 > self.limit {
            fs::rename(&self.path, rotated(&self.path))?;
            self.file = open_append(&self.path)?;
            self.size = 0;
        }
        self.file.write_all(text.as_bytes())?;
        self.size += text.len() as u64;
        Ok(())
    }
}

/// The last `n` lines of `dir/node.log.1` then `dir/node.log`, oldest first; lines that
/// do not parse (e.g. cut by a crash) are skipped.
pub fn read_tail(dir: &Path, n: usize) -> Vec<LogLine> {
    let path = dir.join("node.log");
    let mut out = std::collections::VecDeque::with_capacity(n.min(4096));
    for p in [rotated(&path), path] {
        let Ok(file) = File::open(&p) else { continue };
        for text in BufReader::new(file).lines().map_while(Result::ok) {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
                continue;
            };
            let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            if out.len() == n {
                out.pop_front();
            }
            out.push_back(LogLine {
                sequence: 0,
                time_unix_micros: v["t"].as_u64().unwrap_or(0),
                level: s("l"),
                runnable: s("r"),
                target: s("g"),
                text: s("m"),
            });
        }
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn line(i: u64) -> LogLine {
        LogLine {
            time_unix_micros: i,
            level: "INFO".into(),
            runnable: "root.role".into(),
            target: "t".into(),
            text: format!("line {i} {}", "x".repeat(50)),
            ..Default::default()
        }
    }

    #[test]
    fn the_file_rotates_keeps_two_and_reads_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("log");
        let mut file = RotatingFile::open(&logs, 1000).unwrap();
        for i in 0..100 {
            file.write_line(&line(i)).unwrap();
        }
        let mut names: Vec<_> = fs::read_dir(&logs)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["node.log", "node.log.1"]);
        for name in &names {
            let meta = fs::metadata(logs.join(name)).unwrap();
            assert!(meta.len() <= 1000, "{name}: {}", meta.len());
            assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        }
        assert_eq!(
            fs::metadata(&logs).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let tail = read_tail(&logs, 5);
        assert_eq!(
            tail.iter().map(|l| l.time_unix_micros).collect::<Vec<_>>(),
            [95, 96, 97, 98, 99]
        );
        assert_eq!(tail[4], LogLine { ..line(99) });
        // Reopened (a restart): appends, still bounded.
        let mut again = RotatingFile::open(&logs, 1000).unwrap();
        again.write_line(&line(100)).unwrap();
        assert_eq!(read_tail(&logs, 1)[0].time_unix_micros, 100);
        // A cut last line is skipped.
        fs::OpenOptions::new()
            .append(true)
            .open(logs.join("node.log"))
            .unwrap()
            .write_all(b"{\"t\":1")
            .unwrap();
        assert_eq!(read_tail(&logs, 1)[0].time_unix_micros, 100);
        assert!(read_tail(&dir.path().join("absent"), 5).is_empty());
    }
}

/// Properties over arbitrary log files (proptest): what is written is read back whole,
/// and whatever a file holds (a crash cuts lines, a disk garbles them) the read-back
/// keeps its bound and skips what does not parse.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn any_line() -> impl Strategy<Value = LogLine> {
        (
            any::<u64>(),
            any::<String>(),
            any::<String>(),
            any::<String>(),
            any::<String>(),
        )
            .prop_map(
                |(time_unix_micros, level, runnable, target, text)| LogLine {
                    sequence: 0,
                    time_unix_micros,
                    level,
                    runnable,
                    target,
                    text,
                },
            )
    }

    proptest! {
        #[test]
        fn written_lines_read_back(lines in prop::collection::vec(any_line(), 1..8), n in 1usize..10) {
            let dir = tempfile::tempdir().unwrap();
            let mut file = RotatingFile::open(dir.path(), ROTATE_BYTES).unwrap();
            for line in &lines {
                file.write_line(line).unwrap();
            }
            let tail = read_tail(dir.path(), n);
            prop_assert_eq!(tail.as_slice(), &lines[lines.len().saturating_sub(n)..]);
        }

        #[test]
        fn any_file_reads_back_within_the_bound(
            bytes in prop::collection::vec(
                prop_oneof![
                    Just(b'\n'),
                    any::<u8>(),
                    Just(b'{'),
                    Just(b'"'),
                ],
                0..300,
            ),
            json in prop::collection::vec("\\{\"[tlrgm]\":(-?[0-9]{1,21}|\"[a-z]{0,3}\"|null|\\[\\]|\\{\\})\\}", 0..4),
            n in 1usize..6,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let mut content = bytes;
            for j in json {
                content.push(b'\n');
                content.extend_from_slice(j.as_bytes());
            }
            fs::write(dir.path().join("node.log"), &content).unwrap();
            prop_assert!(read_tail(dir.path(), n).len() <= n);
        }
    }
}
