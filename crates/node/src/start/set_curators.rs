//! `polis-node set-curators --root ROOT ENDPOINT...`: points a stopped node at curators
//! it cannot find by itself — after a restore onto a new address, its cluster directory
//! still names the old ones. The directory is replaced by the given endpoints; nothing
//! else in the root changes. Whom the node trusts does not change either: the cluster CA
//! pinned in its sealed configuration and the curator mark still decide, so a wrong
//! endpoint can keep a node away from its cluster but never impersonate a curator.
//!
//! ```text
//!   root lock (refused while the node runs) ─▶ not decommissioned ─▶ sealed
//!   configuration present (the node belongs to a cluster) ─▶ endpoints parsed ─▶
//!   esp/directory.pb replaced atomically
//! ```
//! A start path's neighbour: runs alone and exits; may not start runnables.

use std::net::SocketAddr;

use anyhow::{Context as _, Result, bail};

use crate::disk::files::{parse_endpoints, save_directory};
use crate::disk::storage::Root;
use crate::start::preflight::lock_root;

/// Replaces `root`'s cluster directory by `endpoints` (host or host:port); returns them
/// as saved.
pub fn set_curators(root: &Root, endpoints: &[String]) -> Result<Vec<SocketAddr>> {
    if endpoints.is_empty() {
        bail!("no curator endpoint given");
    }
    if !root.root.is_dir() {
        bail!("node root {} does not exist", root.root.display());
    }
    let _lock = lock_root(root)?;
    let sealed = root.sealed_configuration();
    if !sealed.exists() {
        bail!(
            "node root {} holds no cluster membership (no sealed configuration at {}): \
             a node that has not joined a cluster finds its curators in its parameters",
            root.root.display(),
            sealed.display()
        );
    }
    let parsed = parse_endpoints(endpoints).context("curator endpoints")?;
    let saved: Vec<String> = parsed.iter().map(SocketAddr::to_string).collect();
    save_directory(root, &saved)
        .with_context(|| format!("writing {}", root.directory().display()))?;
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_without_membership_or_endpoints_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path().join("root"));
        root.prepare().unwrap();
        let none = set_curators(&root, &[]).unwrap_err();
        assert!(none.to_string().contains("no curator endpoint"), "{none:#}");
        let absent = Root::new(dir.path().join("absent"));
        let missing = set_curators(&absent, &["127.0.0.9".into()]).unwrap_err();
        assert!(
            missing.to_string().contains("does not exist"),
            "{missing:#}"
        );
        assert!(!absent.root.exists());
        let fresh = set_curators(&root, &["127.0.0.9".into()]).unwrap_err();
        assert!(
            format!("{fresh:#}").contains("no sealed configuration"),
            "{fresh:#}"
        );
        assert!(!root.directory().exists());
    }

    #[test]
    fn endpoints_replace_the_directory_with_the_default_port() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path().join("root"));
        root.prepare().unwrap();
        std::fs::write(root.sealed_configuration(), b"").unwrap();
        save_directory(&root, &["127.0.0.2:7835".into()]).unwrap();
        let bad = set_curators(&root, &["not an address".into()]).unwrap_err();
        assert!(format!("{bad:#}").contains("curator endpoints"), "{bad:#}");
        assert_eq!(
            crate::disk::files::read_directory(&root).unwrap(),
            vec!["127.0.0.2:7835".parse().unwrap()]
        );
        set_curators(&root, &["127.0.0.7".into(), "127.0.0.8:9000".into()]).unwrap();
        assert_eq!(
            crate::disk::files::read_directory(&root).unwrap(),
            vec![
                "127.0.0.7:7835".parse().unwrap(),
                "127.0.0.8:9000".parse().unwrap()
            ]
        );
    }
}
