//! `--tcp-rto-max-ms`: bounds TCP retransmission backoff in this node's network namespace
//! (`net.ipv4.tcp_rto_max_ms`, Linux ≥ 6.15), before etcd or any connection starts.
//!
//! Why: a cut-off host is silent, so every connection that had data in flight during the
//! cut backs off its retransmissions (200 ms doubling up to the kernel's 120 s). After the
//! heal such a connection resumes only at its next retransmission — seconds later after
//! a cut of 15 s. etcd's peer streams are such connections: the leader's writer toward
//! the returning member blocks on the old stream until it resumes or etcd's 5 s write
//! timeout fires, and meanwhile the member hears no leader (measured: its etcd followed a
//! leader again 0.2–4.8 s after the heal; with a 1 s bound, ≤ 1.5 s). The value is read
//! by each socket when it is created, so it is set before anything connects.
//!
//! A leaf: writes one sysctl file, imports no other module of this crate.

use std::path::Path;

use anyhow::{Context, Result, bail};

/// The sysctl of the calling process's network namespace.
const RTO_MAX_SYSCTL: &str = "/proc/sys/net/ipv4/tcp_rto_max_ms";

/// The range the kernel accepts (`--tcp-rto-max-ms` checks it while parsing).
pub const RTO_MAX_MS_MIN: u64 = 1000;
pub const RTO_MAX_MS_MAX: u64 = 120_000;

/// Sets the namespace's TCP retransmission backoff ceiling to `ms` milliseconds.
pub fn set_rto_max(ms: u64) -> Result<()> {
    set_rto_max_at(Path::new(RTO_MAX_SYSCTL), ms)
}

fn set_rto_max_at(sysctl: &Path, ms: u64) -> Result<()> {
    if !(RTO_MAX_MS_MIN..=RTO_MAX_MS_MAX).contains(&ms) {
        bail!("--tcp-rto-max-ms must be within {RTO_MAX_MS_MIN}..={RTO_MAX_MS_MAX}, got {ms}");
    }
    if !sysctl.exists() {
        bail!(
            "{} does not exist: this kernel cannot bound TCP retransmission backoff (needs \
             Linux 6.15 or later); start without --tcp-rto-max-ms",
            sysctl.display()
        );
    }
    std::fs::write(sysctl, format!("{ms}\n")).with_context(|| {
        format!(
            "writing {ms} to {} (needs root, or CAP_NET_ADMIN in this network namespace)",
            sysctl.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_value_and_refuses_what_the_kernel_would() {
        let dir = tempfile::tempdir().unwrap();
        let sysctl = dir.path().join("tcp_rto_max_ms");
        std::fs::write(&sysctl, "120000\n").unwrap();
        set_rto_max_at(&sysctl, 1000).unwrap();
        assert_eq!(std::fs::read_to_string(&sysctl).unwrap(), "1000\n");
        let low = set_rto_max_at(&sysctl, 999).unwrap_err().to_string();
        assert!(low.contains("1000..=120000"), "{low}");
        assert!(set_rto_max_at(&sysctl, 120_001).is_err());
        let missing = set_rto_max_at(&dir.path().join("absent"), 1000)
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("absent") && missing.contains("6.15"),
            "{missing}"
        );
    }
}
