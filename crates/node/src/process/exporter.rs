//! The node's `/metrics` endpoint: where it listens (`--metrics-listen`, its default),
//! the node-specific collectors (certificate expiry, supervisor restarts) and the task
//! that serves it.
//!
//! Binds before the supervisor starts, so a bad address fails the start with one line;
//! may not decide anything about the cluster.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use anyhow::{Context, Result};
use tracing::Instrument;

use crate::disk::storage::Root;

/// The port `/metrics` listens on by default.
pub const DEFAULT_PORT: u16 = 7839;

/// The default listen address: the node's own address when it is a loopback one (nodes
/// sharing a machine on 127.0.0.x each get their own), else 127.0.0.1: never reachable
/// from other machines unless `--metrics-listen` says so.
pub fn default_listen(node: IpAddr) -> SocketAddr {
    let ip = if node.is_loopback() {
        node
    } else {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    };
    SocketAddr::new(ip, DEFAULT_PORT)
}

/// The certificates this node may hold, by name.
fn certificate_files(root: &Root) -> Vec<(&'static str, std::path::PathBuf)> {
    vec![
        ("node", root.node_certificate()),
        ("cluster-ca", root.cluster_ca()),
        ("etcd-peer", root.etcd_peer_dir().join("cert.pem")),
        ("etcd-peer-ca", root.etcd_peer_dir().join("ca.pem")),
    ]
}

/// Binds `listen`, registers the node's collectors and serves `/metrics` in a task for
/// the life of the process.
pub async fn start(listen: SocketAddr, root: &Root) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("--metrics-listen {listen}: cannot listen there"))?;
    let registry = metrics::global();
    registry.register_collector(Box::new(metrics::certs::CertificateCollector {
        files: certificate_files(root),
    }));
    tracing::info!(%listen, "metrics served on http://{listen}/metrics");
    tokio::spawn(metrics::serve(listener, registry).instrument(tracing::Span::current()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_listen_stays_on_loopback() {
        let own: IpAddr = "127.0.0.4".parse().unwrap();
        assert_eq!(default_listen(own), "127.0.0.4:7839".parse().unwrap());
        let public: IpAddr = "192.0.2.7".parse().unwrap();
        assert_eq!(default_listen(public), "127.0.0.1:7839".parse().unwrap());
    }
}
