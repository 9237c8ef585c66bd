//! Benchmark: what encrypted data (`--data-device`, issue 18) costs. In one run, in
//! turn, a one-node cluster is bootstrapped on plain `ROOT/data` (a directory of the
//! host's file system), on plain `ROOT/data` that is an ext4 file system on a 256 MiB
//! loop image (made as `--data-device` makes one, without the encryption: what the loop
//! device alone costs) and on an encrypted 256 MiB loop image (root only), and each
//! time:
//!
//! ```text
//!   bootstrap: polis-node start → Home (the encrypted one formats its image first)
//!   writes:    16 owner clients call UpdateNodeLabels for SECONDS, each over its own
//!              mutual-TLS connection (every write an etcd txn on the data directory)
//! ```
//! One line per sample; the last line printed is one JSON object: writes/s of each
//! (summed over rounds), the encrypted ÷ plain ratio (target ≥ 0.9), the encrypted ÷
//! plain-on-the-same-loop-ext4 ratio (the cost of the encryption alone), the median
//! bootstrap of plain and encrypted and the encrypted one's overhead.
//!
//! Usage: bench-encrypted [SECONDS_PER_MEASUREMENT] [ROUNDS]   (default 5 and 3)

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::{
    Cluster, Node, TIMEOUT, is_home_line, median, seconds_and_rounds, timed_calls, write_label,
};
use serde_json::json;

const CLIENTS: usize = 16;
/// Calls per client and measurement, at most (a bound on a runaway loop).
const MAX_CALLS: usize = 1_000_000;

/// Unmounts what a node killed by its guard left mounted (declared before the node).
struct Mounts(PathBuf);

impl Drop for Mounts {
    fn drop(&mut self) {
        for d in [self.0.join("data"), self.0.join("datafs")] {
            while datafs::mounts::is_mount_point(&d).unwrap_or(false) {
                if datafs::mounts::unmount(&d).is_err() {
                    break;
                }
            }
        }
    }
}

/// Where a node's data lives in a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Data {
    /// A directory on the host's file system (no `--data-device`).
    Plain,
    /// A directory that is an unencrypted ext4 on a loop image, mounted by the bench.
    PlainLoop,
    /// `--data-device` on a loop image.
    Encrypted,
}

impl Data {
    fn name(self) -> &'static str {
        match self {
            Data::Plain => "plain",
            Data::PlainLoop => "plain-loop-ext4",
            Data::Encrypted => "encrypted",
        }
    }
}

/// A sparse 256 MiB image file, as `cluster launch --encrypted` makes.
fn image(dir: &Path) -> Result<PathBuf> {
    let img = dir.join("data.img");
    std::fs::File::create(&img)?.set_len(256 << 20)?;
    Ok(img)
}

/// Makes `data_dir` an ext4 on a loop image, formatted with the options `datafs` uses
/// (so the file systems differ only by the encryption policy).
fn mount_plain_loop(dir: &Path, data_dir: &Path) -> Result<()> {
    let img = image(dir)?;
    let loop_dev = datafs::loopdev::attach(&img).context("attaching a loop device")?;
    let out = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096", "-m", "0", "-O", "encrypt"])
        .arg(loop_dev.path())
        .output()
        .context("running mkfs.ext4")?;
    ensure!(
        out.status.success(),
        "mkfs.ext4 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::create_dir_all(data_dir)?;
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    datafs::mounts::mount(loop_dev.path(), data_dir, Some("ext4"), flags)
        .with_context(|| format!("mounting the loop ext4 on {}", data_dir.display()))?;
    Ok(())
}

/// Bootstraps a one-node cluster in `dir` with its data as `data` says, takes
/// ownership; returns it and its start → Home time in ms.
fn bootstrap(dir: &Path, data: Data) -> Result<(Cluster, f64)> {
    let first_dir = dir.join("n0");
    std::fs::create_dir_all(&first_dir)?;
    let mut first = Node::new(&first_dir);
    let params = first.bootstrap_params()?;
    let mut args = vec![
        "--params".to_string(),
        params.to_str().context("utf-8 path")?.to_string(),
    ];
    match data {
        Data::Plain => {}
        Data::PlainLoop => mount_plain_loop(dir, &first_dir.join("root/data"))?,
        Data::Encrypted => {
            args.push("--data-device".into());
            args.push(image(dir)?.to_str().context("utf-8 path")?.to_string());
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let proc = first.start(&args)?;
    proc.wait_for_line(TIMEOUT, is_home_line)?;
    let ms = proc.started.elapsed().as_secs_f64() * 1000.0;
    let cluster = Cluster {
        dir: dir.to_path_buf(),
        config: first_dir.join("config"),
        first,
        node_args: vec![],
    };
    let endpoint = cluster.first.address.to_string();
    cluster.ctl_retry(&["--endpoints", &endpoint, "takeownership", "--accept-ca"])?;
    Ok((cluster, ms))
}

/// Label writes made by every client in `duration` (failed ones counted apart).
async fn writes(
    clients: &[Arc<rpc::CuratorClient>],
    id: &str,
    duration: Duration,
) -> (usize, usize) {
    let id = id.to_string();
    let calls = timed_calls(clients, duration, MAX_CALLS, move |c, w, i| {
        let id = id.clone();
        async move { write_label(&c, &id, &format!("bench-{w}"), &i.to_string()).await }
    })
    .await;
    (calls.ok, calls.failed)
}

fn main() -> Result<()> {
    let (seconds, rounds) = seconds_and_rounds(std::env::args().skip(1), 5.0, 3)?;
    ensure!(
        datafs::fscrypt::kernel_supports_ext4_encryption(),
        "this kernel lacks ext4 encryption (/sys/fs/ext4/features/encryption)"
    );
    // SAFETY: geteuid(2) has no preconditions.
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "bench-encrypted needs root (loop devices, mounts)"
    );
    let duration = Duration::from_secs_f64(seconds.clamp(0.5, 60.0));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    const MODES: [Data; 3] = [Data::Plain, Data::PlainLoop, Data::Encrypted];
    // Per mode: acknowledged writes summed over rounds, bootstrap times.
    let mut samples: HashMap<&str, (usize, Vec<f64>)> = HashMap::new();
    for round in 0..rounds {
        // Each mode goes first in some round, so a drift of the machine spreads evenly.
        let mut order = MODES;
        order.rotate_left(round % MODES.len());
        for data in order {
            let dir = tempfile::tempdir()?;
            let _mounts = Mounts(dir.path().join("n0/root"));
            let (mut cluster, boot_ms) = bootstrap(dir.path(), data)?;
            let id = cluster.first.key_node_id()?;
            let (ok, failed) = runtime.block_on(async {
                let clients: Vec<_> = (0..CLIENTS)
                    .map(|_| cluster.owner_client().map(Arc::new))
                    .collect::<Result<_>>()?;
                // Connections up and the leader known before the clock runs.
                let warm = writes(&clients, &id, Duration::from_millis(500)).await;
                ensure!(warm.0 > 0, "no write succeeded while warming up");
                Ok::<_, anyhow::Error>(writes(&clients, &id, duration).await)
            })?;
            let per_s = ok as f64 / duration.as_secs_f64();
            println!(
                "{}",
                json!({"round": round, "data": data.name(), "bootstrap_ms": (boot_ms * 10.0).round() / 10.0,
                       "writes_per_s": per_s.round(), "failed": failed})
            );
            let slot = samples.entry(data.name()).or_default();
            slot.0 += ok;
            slot.1.push(boot_ms);
            let proc = cluster.first.proc();
            proc.signal(libc::SIGTERM);
            proc.wait_exit(TIMEOUT)?;
        }
    }
    let total = duration.as_secs_f64() * rounds as f64;
    let mut take = |data: Data| samples.remove(data.name()).unwrap_or_default();
    let (plain, plain_loop, encrypted) = (
        take(Data::Plain),
        take(Data::PlainLoop),
        take(Data::Encrypted),
    );
    let (wp, wl, we) = (
        plain.0 as f64 / total,
        plain_loop.0 as f64 / total,
        encrypted.0 as f64 / total,
    );
    let (bp, be) = (median(plain.1), median(encrypted.1));
    println!(
        "{}",
        json!({
            "bench": "encrypted",
            "writes_per_s_plain": wp.round(),
            "writes_per_s_plain_loop_ext4": wl.round(),
            "writes_per_s_encrypted": we.round(),
            "write_ratio": (we / wp * 100.0).round() / 100.0,
            "write_ratio_same_device": (we / wl * 100.0).round() / 100.0,
            "bootstrap_ms_plain": (bp * 10.0).round() / 10.0,
            "bootstrap_ms_encrypted": (be * 10.0).round() / 10.0,
            "bootstrap_overhead_ms": ((be - bp) * 10.0).round() / 10.0,
        })
    );
    Ok(())
}
