//! `polisctl dashboard` against a real three-member cluster, on a tmux screen: it shows
//! every node, the leaders and the audit log, and quits with status 0 on `q`, Ctrl-C or
//! SIGTERM, the terminal restored; without a terminal it refuses with a message naming
//! the commands to use instead.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, bail};
use e2e::{Cluster, TIMEOUT, bin, endpoints, polisctl, wait_until};

const TMUX: &str = "tmux";

/// A tmux server on a socket of its own (`-L`), killed on drop with all it runs.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn new() -> Tmux {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Tmux {
            socket: format!("polis-dashboard-{}-{n}", std::process::id()),
        }
    }

    fn run(&self, args: &[&str]) -> Result<Output> {
        Command::new(TMUX)
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .with_context(|| format!("running tmux {args:?}"))
    }

    /// Starts `command` (a shell command line) in a detached 160×50 session "dash".
    fn start(&self, command: &str) -> Result<()> {
        let out = self.run(&[
            "new-session",
            "-d",
            "-x",
            "160",
            "-y",
            "50",
            "-s",
            "dash",
            command,
        ])?;
        if !out.status.success() {
            bail!("tmux new-session: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// The visible screen, or empty once the session is gone.
    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "dash"])
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

fn shell_quote(s: &Path) -> Result<String> {
    let s = s.to_str().context("utf-8 path")?;
    Ok(format!("'{}'", s.replace('\'', r"'\''")))
}

/// Files a dashboard run under tmux leaves in `dir`: its stderr, then (once it exited)
/// the terminal's settings and, last, its exit status.
struct Run {
    stderr: PathBuf,
    stty: PathBuf,
    status: PathBuf,
}

impl Run {
    /// Starts `polisctl dashboard` in `tmux`'s session.
    fn start(tmux: &Tmux, cluster: &Cluster, dir: &Path) -> Result<Run> {
        let run = Run {
            stderr: dir.join("stderr"),
            stty: dir.join("stty"),
            status: dir.join("status"),
        };
        let status_part = dir.join("status.part");
        let command = format!(
            "{} --config {} dashboard 2>{}; echo $? >{}; stty -a >{}; mv {} {}",
            shell_quote(&bin("polisctl"))?,
            shell_quote(&cluster.config)?,
            shell_quote(&run.stderr)?,
            shell_quote(&status_part)?,
            shell_quote(&run.stty)?,
            shell_quote(&status_part)?,
            shell_quote(&run.status)?,
        );
        tmux.start(&command)?;
        Ok(run)
    }

    /// Waits until the dashboard exited; checks it exited 0 and left the terminal out
    /// of raw mode (line editing and echo back on).
    fn wait_exit_0(&self) -> Result<()> {
        let mut status = String::new();
        wait_until("the dashboard exits", TIMEOUT, || {
            status = std::fs::read_to_string(&self.status).unwrap_or_default();
            !status.trim().is_empty()
        })?;
        let stderr = std::fs::read_to_string(&self.stderr)?;
        assert_eq!(
            status.trim(),
            "0",
            "dashboard exit status; stderr: {stderr}"
        );
        let stty = std::fs::read_to_string(&self.stty)?;
        let flags: Vec<&str> = stty.split_whitespace().collect();
        for flag in ["icanon", "echo", "isig"] {
            assert!(
                flags.contains(&flag),
                "terminal left without {flag}: {stty}"
            );
        }
        Ok(())
    }
}

#[test]
fn dashboard_shows_a_three_member_cluster_and_quits_on_q() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(tmp.path())?;
    let params = cluster.register_params("nodes")?;
    let (w1, id1) = cluster.add_worker("w1", &params)?;
    let (w2, id2) = cluster.add_worker("w2", &params)?;
    for id in [&id1, &id2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    cluster.wait_members(&endpoints(&[&cluster.first, &w1, &w2]), 3, 0)?;
    let id0 = cluster.first.key_node_id()?;
    let ids = [&id0, &id1, &id2];

    let first = tmp.path().join("first");
    std::fs::create_dir(&first)?;
    let tmux = Tmux::new();
    let run = Run::start(&tmux, &cluster, &first)?;
    let mut screen = String::new();
    let shown = wait_until("the dashboard shows the cluster", TIMEOUT, || {
        screen = tmux.screen();
        let leader_row = |id: &str| {
            screen
                .lines()
                .any(|l| l.contains(id) && l.contains("LEADER"))
        };
        ids.iter().all(|id| screen.contains(id.as_str()))
            && screen.contains("Consensus members (3, quorum)")
            && ids.iter().any(|id| leader_row(id))
            && screen.contains("UpdateNodeRoles")
    });
    if let Err(e) = shown {
        let stderr = std::fs::read_to_string(&run.stderr);
        bail!("{e}\nscreen:\n{screen}\nstderr: {stderr:?}");
    }
    // One row per member, each with its raft index and database size.
    let member_rows = screen
        .lines()
        .filter(|l| l.contains("follower") || (l.contains("LEADER") && l.contains("in use")))
        .count();
    assert_eq!(member_rows, 3, "screen:\n{screen}");
    let out = tmux.run(&["send-keys", "-t", "dash", "q"])?;
    assert!(out.status.success(), "send-keys: {out:?}");
    run.wait_exit_0()?;

    // Ctrl-C quits as cleanly (raw mode: it is a key, not a signal).
    let second = tmp.path().join("second");
    std::fs::create_dir(&second)?;
    let tmux = Tmux::new();
    let run = Run::start(&tmux, &cluster, &second)?;
    wait_until("the second dashboard shows the nodes", TIMEOUT, || {
        let screen = tmux.screen();
        ids.iter().all(|id| screen.contains(id.as_str()))
    })?;
    let out = tmux.run(&["send-keys", "-t", "dash", "C-c"])?;
    assert!(out.status.success(), "send-keys: {out:?}");
    run.wait_exit_0()?;

    // SIGTERM too.
    let third = tmp.path().join("third");
    std::fs::create_dir(&third)?;
    let tmux = Tmux::new();
    let run = Run::start(&tmux, &cluster, &third)?;
    wait_until("the third dashboard shows the nodes", TIMEOUT, || {
        let screen = tmux.screen();
        ids.iter().all(|id| screen.contains(id.as_str()))
    })?;
    // The pane runs `sh -c`, whose one child is polisctl.
    let out = tmux.run(&["list-panes", "-t", "dash", "-F", "#{pane_pid}"])?;
    let shell = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children"))?;
    let pid: i32 = children
        .split_whitespace()
        .next()
        .with_context(|| format!("no child of the pane's shell {shell}"))?
        .parse()?;
    // SAFETY: kill(2) with a pid this test's dashboard has (the pane is ours).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    run.wait_exit_0()
}

#[test]
fn dashboard_without_a_terminal_says_what_to_use_instead() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let config = tmp.path().join("config");
    // stdout is a pipe here: no terminal.
    let (status, out, err) = polisctl(&[
        "--config",
        config.to_str().context("utf-8 path")?,
        "dashboard",
    ])?;
    assert!(!status.success(), "exit status {status:?}; stdout: {out}");
    assert!(
        err.contains("polisctl dashboard needs a terminal")
            && err.contains("polisctl node list")
            && err.contains("cluster status"),
        "stderr: {err}"
    );
    assert!(out.is_empty(), "stdout: {out}");
    Ok(())
}
