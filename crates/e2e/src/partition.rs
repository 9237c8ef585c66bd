//! Network partitions between nodes: a hub namespace holding a bridge, one namespace per
//! node with a veth to the bridge, and cuts — both ways (the hub end of the node's veth
//! down) or one way (nftables in the node's namespace drops what it sends) — that heal.
//!
//! ```text
//!   hub netns: br0 10.77.0.1/24 ─┬─ vh0 ══ eth0 10.77.0.10  netns of slot 0 (polis-node)
//!                                ├─ vh1 ══ eth0 10.77.0.11  netns of slot 1
//!                                └─ …
//! ```
//! Every address lives inside namespaces created here, never on the host's interfaces;
//! dropping the [`Partition`] deletes them all (their veths and bridge go with them),
//! also when a test panics. A thread that calls [`Partition::enter_hub`] talks from the
//! hub (as polisctl and the owner's client do in the tests) until its guard is dropped;
//! processes it spawns start there too.
//!
//! A leaf: runs `ip` and `nft` only; may not start Polis processes.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// One node's place: its namespace, the hub end of its veth, its address.
#[derive(Debug, Clone)]
pub struct Slot {
    pub name: String,
    pub netns: String,
    pub hub_veth: String,
    pub address: IpAddr,
}

/// A hub with a bridge and one namespace per slot; deleted on drop.
pub struct Partition {
    pub hub: String,
    pub slots: Vec<Slot>,
}

fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<()> {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {program}"))?;
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .context("piped stdin")?
            .write_all(input.as_bytes())
            .with_context(|| format!("writing to {program}"))?;
    }
    drop(child.stdin.take());
    let out = child
        .wait_with_output()
        .with_context(|| format!("waiting for {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn ip(args: &[&str]) -> Result<()> {
    run("ip", args, None)
}

impl Partition {
    /// A hub and one namespace per name in `names` (addresses 10.77.0.10, .11, … in the
    /// order given). Fails when namespaces cannot be created (no privileges).
    pub fn create(names: &[&str]) -> Result<Partition> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tag = format!("{:06x}", (std::process::id() ^ nanos) & 0xff_ffff);
        let mut partition = Partition {
            hub: format!("polis-hub-{tag}"),
            slots: Vec::new(),
        };
        ip(&["netns", "add", &partition.hub])?;
        let hub = partition.hub.clone();
        ip(&["-n", &hub, "link", "set", "lo", "up"])?;
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &hub, "addr", "add", "10.77.0.1/24", "dev", "br0"])?;
        ip(&["-n", &hub, "link", "set", "br0", "up"])?;
        for (i, name) in names.iter().enumerate() {
            let slot = Slot {
                name: name.to_string(),
                netns: format!("polis-p{i}-{tag}"),
                hub_veth: format!("vh{i}"),
                address: IpAddr::V4(Ipv4Addr::new(10, 77, 0, 10 + i as u8)),
            };
            ip(&["netns", "add", &slot.netns])?;
            // Pushed before its devices exist, so that drop deletes it whatever fails next.
            partition.slots.push(slot.clone());
            let ns = slot.netns.as_str();
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&[
                "-n",
                &hub,
                "link",
                "add",
                &slot.hub_veth,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            ])?;
            ip(&["-n", &hub, "link", "set", &slot.hub_veth, "master", "br0"])?;
            ip(&["-n", &hub, "link", "set", &slot.hub_veth, "up"])?;
            let cidr = format!("{}/24", slot.address);
            ip(&["-n", ns, "addr", "add", &cidr, "dev", "eth0"])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        }
        Ok(partition)
    }

    /// The slot named `name`.
    pub fn slot(&self, name: &str) -> Result<&Slot> {
        self.slots
            .iter()
            .find(|s| s.name == name)
            .with_context(|| format!("no partition slot named {name}"))
    }

    /// The slot holding `address`.
    pub fn slot_of(&self, address: IpAddr) -> Result<&Slot> {
        self.slots
            .iter()
            .find(|s| s.address == address)
            .with_context(|| format!("no partition slot has address {address}"))
    }

    /// Cuts slot `name` off both ways: the hub end of its veth goes down.
    pub fn cut(&self, name: &str) -> Result<()> {
        let slot = self.slot(name)?;
        ip(&["-n", &self.hub, "link", "set", &slot.hub_veth, "down"])
    }

    /// Cuts slot `name` one way: everything it sends is dropped (nftables, output hook of
    /// its namespace, on its veth only); it still receives.
    pub fn cut_outgoing(&self, name: &str) -> Result<()> {
        let slot = self.slot(name)?;
        let rules = "table inet polis_cut {\n  chain out {\n    type filter hook output priority 0; policy accept;\n    oifname \"eth0\" drop\n  }\n}\n";
        run(
            "ip",
            &["netns", "exec", &slot.netns, "nft", "-f", "-"],
            Some(rules),
        )
    }

    /// Heals every cut of slot `name` (both-way and one-way).
    pub fn heal(&self, name: &str) -> Result<()> {
        let slot = self.slot(name)?;
        // No table means no one-way cut: nothing to delete.
        let _ = run(
            "ip",
            &[
                "netns",
                "exec",
                &slot.netns,
                "nft",
                "delete",
                "table",
                "inet",
                "polis_cut",
            ],
            None,
        );
        ip(&["-n", &self.hub, "link", "set", &slot.hub_veth, "up"])
    }

    /// Moves the calling thread into the hub namespace until the guard is dropped
    /// (threads and processes it starts meanwhile are there too).
    pub fn enter_hub(&self) -> Result<HubGuard> {
        let original = std::fs::File::open("/proc/thread-self/ns/net")
            .context("opening this thread's network namespace")?;
        let path = format!("/run/netns/{}", self.hub);
        let hub = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
        setns(&hub).with_context(|| format!("entering namespace {}", self.hub))?;
        Ok(HubGuard { original })
    }
}

fn setns(file: &std::fs::File) -> Result<()> {
    // SAFETY: setns(2) on an open namespace file descriptor; affects this thread only.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("setns");
    }
    Ok(())
}

/// Returns its thread to the namespace it came from when dropped.
pub struct HubGuard {
    original: std::fs::File,
}

impl Drop for HubGuard {
    fn drop(&mut self) {
        let _ = setns(&self.original);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        for slot in &self.slots {
            let _ = Command::new("ip")
                .args(["netns", "del", &slot.netns])
                .stderr(Stdio::null())
                .status();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.hub])
            .stderr(Stdio::null())
            .status();
    }
}
