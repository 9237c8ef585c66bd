//! `polisctl cluster launch DIR --encrypted`: a local 3-node cluster whose nodes keep
//! their data on encrypted image files (DIR/nodeK/data.img); stopped and launched again
//! it cold-starts (the members unlock each other), then is destroyed. Root only; skipped
//! with a printed reason where the kernel lacks ext4 encryption.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use e2e::{TIMEOUT, polisctl, process_alive, wait_until};

/// Kills whatever the launched cluster left running and unmounts what it left mounted
/// when the test ends, also on failure.
struct Launched(PathBuf);

impl Launched {
    fn pids(&self) -> Vec<i32> {
        (1..=3)
            .filter_map(|k| {
                std::fs::read_to_string(self.0.join(format!("node{k}/pid")))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            })
            .collect()
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        for pid in self.pids() {
            if process_alive(pid) {
                // SAFETY: kill(2) on a polis-node this test launched.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
        for k in 1..=3 {
            let root = self.0.join(format!("node{k}/root"));
            for d in [root.join("data"), root.join("datafs")] {
                while datafs::mounts::is_mount_point(&d).unwrap_or(false) {
                    if datafs::mounts::unmount(&d).is_err() {
                        break;
                    }
                }
            }
        }
    }
}

/// Three consecutive loopback addresses whose node ports are free.
fn three_free_addresses() -> Ipv4Addr {
    loop {
        let IpAddr::V4(base) = e2e::unique_loopback() else {
            unreachable!("unique_loopback is IPv4")
        };
        let [a, b, c, d] = base.octets();
        if d > 250 {
            continue;
        }
        let free = (0..3).all(|i| {
            let ip = Ipv4Addr::new(a, b, c, d + i);
            [7834u16, 7835, 7837]
                .iter()
                .all(|p| std::net::TcpListener::bind((ip, *p)).is_ok())
        });
        if free {
            return base;
        }
    }
}

fn ctl(args: &[&str]) -> Result<String> {
    let (status, out, err) = polisctl(args)?;
    ensure!(status.success(), "polisctl {args:?}: {err}");
    Ok(out)
}

fn all_up(config: &Path) -> bool {
    let Some(config) = config.to_str() else {
        return false;
    };
    ctl(&["--config", config, "node", "list", "-o", "json"])
        .ok()
        .and_then(|out| serde_json::from_str::<serde_json::Value>(&out).ok())
        .and_then(|v| v.as_array().cloned())
        .is_some_and(|n| n.len() == 3 && n.iter().all(|n| n["state"] == "UP"))
}

#[test]
fn an_encrypted_launch_cold_starts_after_a_stop() -> Result<()> {
    if !datafs::fscrypt::kernel_supports_ext4_encryption() {
        println!("SKIPPED: this kernel lacks ext4 encryption (/sys/fs/ext4/features/encryption)");
        return Ok(());
    }
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("cluster");
    let guard = Launched(dir.clone());
    let first = three_free_addresses().to_string();
    let d = dir.to_str().context("utf-8")?;
    let node_binary = e2e::bin("polis-node");
    let binary = node_binary.to_str().context("utf-8")?;
    let out = ctl(&[
        "cluster",
        "launch",
        d,
        "--nodes",
        "3",
        "--first-address",
        &first,
        "--node-binary",
        binary,
        "--encrypted",
    ])?;
    ensure!(out.contains("ConsensusMember"), "{out}");
    let config = dir.join("config");
    ensure!(all_up(&config), "not every node is UP after the launch");
    for k in 1..=3 {
        let root = dir.join(format!("node{k}/root"));
        ensure!(
            dir.join(format!("node{k}/data.img")).exists(),
            "node{k} has no data image"
        );
        ensure!(
            datafs::mounts::is_mount_point(&root.join("data"))?,
            "node{k}'s data is not the encrypted mount"
        );
    }

    ctl(&["cluster", "launch", d, "--stop"])?;
    for k in 1..=3 {
        let data = dir.join(format!("node{k}/root/data"));
        ensure!(
            !datafs::mounts::is_mount_point(&data)?,
            "node{k} stayed mounted after --stop"
        );
    }
    // Launched again: all three are locked, and unlock each other.
    ctl(&["cluster", "launch", d, "--node-binary", binary])?;
    wait_until("the three encrypted nodes UP again", TIMEOUT, || {
        all_up(&config)
    })?;
    ctl(&["cluster", "destroy", d])?;
    ensure!(!dir.exists(), "destroy left the directory");
    for pid in guard.pids() {
        ensure!(!process_alive(pid), "node {pid} still runs");
    }
    Ok(())
}
