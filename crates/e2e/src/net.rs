//! Addresses and network namespaces: unique loopback addresses so tests run in
//! parallel, and namespaces that are deleted when their guard is dropped.
//!
//! A leaf: may not start Polis processes.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// A fresh 127.x.y.z address whose etcd peer and curator ports are free.
pub fn unique_loopback() -> IpAddr {
    loop {
        let mut bytes = [0u8; 3];
        getrandom(&mut bytes);
        let addr = Ipv4Addr::new(127, bytes[0].max(1), bytes[1], bytes[2].clamp(2, 254));
        let ip = IpAddr::V4(addr);
        // The ports polis-node listens on: etcd peers and the curator.
        let free = |port: u16| std::net::TcpListener::bind((ip, port)).is_ok();
        if free(consensus::config::PEER_PORT) && free(7835) {
            return ip;
        }
    }
}

fn getrandom(buf: &mut [u8]) {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .expect("reading /dev/urandom");
}

/// A network namespace created for one test, deleted on drop.
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    /// Creates a namespace holding a veth pair, one end with `address`/32.
    pub fn with_address(address: &str) -> Result<NetNs> {
        let mut suffix = [0u8; 4];
        getrandom(&mut suffix);
        let ns = NetNs {
            name: format!("polis-e2e-{}", u32::from_le_bytes(suffix)),
        };
        let run = |args: &[&str]| -> Result<()> {
            let out = Command::new("ip")
                .args(args)
                .output()
                .context("running ip (iproute2)")?;
            if !out.status.success() {
                bail!("ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            }
            Ok(())
        };
        run(&["netns", "add", &ns.name])?;
        run(&[
            "-n", &ns.name, "link", "add", "v0", "type", "veth", "peer", "name", "v1",
        ])?;
        run(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{address}/32"),
            "dev",
            "v0",
        ])?;
        run(&["-n", &ns.name, "link", "set", "v0", "up"])?;
        Ok(ns)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}
