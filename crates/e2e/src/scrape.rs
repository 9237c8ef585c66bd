//! Metrics from the outside: a plain HTTP GET of a node's `/metrics`, `promtool check
//! metrics` on it, and a real Prometheus server (Debian's `prometheus`) scraping given
//! targets, queried over its HTTP API.
//!
//! Talks HTTP/1.0 over loopback only; may not start Polis processes.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::net::unique_loopback;
use crate::process::Proc;

/// The port polis-node serves `/metrics` on by default.
pub const METRICS_PORT: u16 = 7839;

/// GET `path` from `at` (HTTP/1.0, whole body): (status, body).
pub fn http_get(at: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&at, Duration::from_secs(5))
        .with_context(|| format!("connecting to {at}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {at}\r\n\r\n")?;
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .with_context(|| format!("reading from {at}"))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("no end of HTTP headers")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no HTTP status")?;
    Ok((status, body.to_string()))
}

/// A node's `/metrics` on its default listener (its own loopback address).
pub fn scrape(node: IpAddr) -> Result<String> {
    let (status, body) = http_get(SocketAddr::new(node, METRICS_PORT), "/metrics")?;
    if status != 200 {
        bail!("GET /metrics on {node}: HTTP {status}: {body}");
    }
    Ok(body)
}

/// `promtool check metrics` on `text`: Ok, or its complaints.
pub fn promtool_check(text: &str) -> Result<()> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running promtool (Debian package prometheus)")?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() || !out.stdout.is_empty() || !out.stderr.is_empty() {
        bail!(
            "promtool check metrics: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A Prometheus server with its own config and data in a directory, on a fresh
/// loopback address; killed when dropped.
pub struct Prometheus {
    pub address: SocketAddr,
    pub proc: Proc,
}

impl Prometheus {
    /// Starts Prometheus in `dir` scraping `targets` (ADDR:PORT) every second.
    pub fn start(dir: &Path, targets: &[SocketAddr]) -> Result<Prometheus> {
        std::fs::create_dir_all(dir.join("data"))?;
        let list: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: polis\n    static_configs:\n      - targets: [{}]\n",
            list.join(", ")
        );
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config)?;
        let address = SocketAddr::new(unique_loopback(), 9090);
        let mut cmd = Command::new("prometheus");
        cmd.arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .current_dir(dir);
        let proc = Proc::spawn("prometheus", cmd, &dir.join("prometheus.log"))?;
        Ok(Prometheus { address, proc })
    }

    /// An instant query's result vector (`data.result`), or an error while the server
    /// is not up yet.
    pub fn query(&self, query: &str) -> Result<Vec<serde_json::Value>> {
        let encoded: String = query
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let (status, body) = http_get(self.address, &format!("/api/v1/query?query={encoded}"))?;
        if status != 200 {
            bail!("query {query}: HTTP {status}: {body}");
        }
        let value: serde_json::Value = serde_json::from_str(&body)?;
        Ok(value["data"]["result"]
            .as_array()
            .context("no data.result")?
            .clone())
    }
}
