//! Child processes: finding the workspace's binaries, spawning a process whose output is
//! captured line by line, and killing it when its guard ([`Proc`]) is dropped.
//!
//! Knows nothing about Polis: may not import the node, cluster or etcd modules.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Directory holding the workspace's binaries (target/debug or target/release).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe works on Linux");
    let mut dir = exe
        .parent()
        .expect("executables live in a directory")
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// Path of a workspace binary, with a hint when it has not been built.
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing; run `cargo build --workspace` first",
        path.display()
    );
    path
}

/// Lines a process wrote to stderr/stdout, shared with a reader thread.
#[derive(Default)]
struct Output {
    lines: Mutex<Vec<String>>,
    changed: Condvar,
    /// Pipes still being read (stderr, stdout): 0 once both reached end of file.
    open_pipes: Mutex<usize>,
    pipe_closed: Condvar,
}

/// How long an exited process's output may take to be read to its end.
const PIPES_CLOSE: Duration = Duration::from_secs(5);

/// A child process that is killed (SIGKILL) when dropped.
pub struct Proc {
    pub child: Child,
    output: Arc<Output>,
    pub started: Instant,
    name: String,
}

impl Proc {
    /// Spawns `cmd`, capturing stderr and stdout line by line (also into `log`).
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Proc> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = cmd.spawn().with_context(|| format!("spawning {name}"))?;
        let output = Arc::new(Output::default());
        let log_file = Arc::new(Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .with_context(|| format!("opening {}", log.display()))?,
        ));
        let pipes: Vec<Box<dyn std::io::Read + Send>> = vec![
            Box::new(child.stderr.take().expect("piped")),
            Box::new(child.stdout.take().expect("piped")),
        ];
        *output.open_pipes.lock().expect("pipes lock") = pipes.len();
        for pipe in pipes {
            let output = output.clone();
            let log_file = log_file.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    use std::io::Write;
                    let _ = writeln!(log_file.lock().expect("log lock"), "{line}");
                    output.lines.lock().expect("output lock").push(line);
                    output.changed.notify_all();
                }
                *output.open_pipes.lock().expect("pipes lock") -= 1;
                output.pipe_closed.notify_all();
            });
        }
        Ok(Proc {
            child,
            output,
            started,
            name: name.to_string(),
        })
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// All output so far.
    pub fn output(&self) -> String {
        self.output.lines.lock().expect("output lock").join("\n")
    }

    /// Waits for an output line matching `pred`; fails if the process exits first.
    pub fn wait_for_line(
        &mut self,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<String> {
        let deadline = Instant::now() + timeout;
        let mut seen = 0;
        loop {
            {
                let lines = self.output.lines.lock().expect("output lock");
                if let Some(l) = lines[seen..].iter().find(|l| pred(l)) {
                    return Ok(l.clone());
                }
                seen = lines.len();
                let _ = self
                    .output
                    .changed
                    .wait_timeout(lines, Duration::from_millis(20))
                    .expect("output lock");
            }
            if let Some(status) = self.child.try_wait()? {
                // Give the reader threads a moment to drain the pipes.
                std::thread::sleep(Duration::from_millis(50));
                let lines = self.output.lines.lock().expect("output lock");
                if let Some(l) = lines.iter().find(|l| pred(l)) {
                    return Ok(l.clone());
                }
                bail!(
                    "{} exited ({status}) before the awaited line; output:\n{}",
                    self.name,
                    lines.join("\n")
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "timed out after {timeout:?} waiting for a line from {}; output:\n{}",
                    self.name,
                    self.output()
                );
            }
        }
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                self.wait_for_pipes_closed(deadline.max(Instant::now() + PIPES_CLOSE));
                return Ok(status);
            }
            if Instant::now() > deadline {
                // Where it hangs: its last lines (a shutdown that never ends).
                let output = self.output();
                let lines: Vec<&str> = output.lines().collect();
                bail!(
                    "{} did not exit within {timeout:?}; its last lines:\n{}",
                    self.name,
                    lines[lines.len().saturating_sub(40)..].join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits (until `deadline`) for the reader threads to reach the end of both pipes,
    /// so that every line the process wrote before it exited is in `output()`. A
    /// grandchild that inherited a pipe may hold it open: then the wait ends at the
    /// deadline.
    fn wait_for_pipes_closed(&self, deadline: Instant) {
        let mut open = self.output.open_pipes.lock().expect("pipes lock");
        while *open > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let (guard, _) = self
                .output
                .pipe_closed
                .wait_timeout(open, left)
                .expect("pipes lock");
            open = guard;
        }
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.pid(), signal);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Whether a process exists (and is not a zombie).
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
        Err(_) => false,
    }
}
