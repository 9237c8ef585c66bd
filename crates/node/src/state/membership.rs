//! Membership data: who this node is and how it belongs to its cluster, as the start
//! paths (bootstrap, register, join) hand it to the runnables.
//!
//! Plain data and pure functions over it: no I/O, and imports no other module of this
//! crate.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use identity::NodeKey;
use pki::{Ca, Issued};
use proto::config::{ClusterBootstrap, LocalRoles, SealedConfiguration};

/// Data for the role server: who this node is and how it belongs to its cluster.
#[derive(Debug, Clone)]
pub enum Membership {
    Bootstrap(Arc<BootstrapData>),
    Join(Arc<JoinData>),
}

impl Membership {
    pub fn key(&self) -> &NodeKey {
        match self {
            Membership::Bootstrap(b) => &b.key,
            Membership::Join(j) => &j.key,
        }
    }

    /// The roles this node starts with (a bootstrapping node: consensus member only).
    pub fn roles(&self) -> LocalRoles {
        match self {
            Membership::Bootstrap(_) => LocalRoles {
                consensus_member: true,
                ..Default::default()
            },
            Membership::Join(j) => j.roles,
        }
    }

    /// Whether this node runs etcd and a curator.
    pub fn consensus_member(&self) -> bool {
        match self {
            Membership::Bootstrap(_) => true,
            Membership::Join(j) => j.roles.consensus_member,
        }
    }
}

#[derive(Debug)]
pub struct BootstrapData {
    pub key: NodeKey,
    pub parameters: ClusterBootstrap,
    pub cluster_ca: Ca,
    pub peer_ca: Ca,
    pub peer_certificate: Issued,
    /// An earlier attempt of this bootstrap left etcd data: etcd starts with that
    /// attempt's peer files, and `bootstrap::finish` takes the CAs it stored, if any.
    pub resumed_etcd: bool,
}

#[derive(Debug)]
pub struct JoinData {
    pub key: NodeKey,
    pub sealed: SealedConfiguration,
    /// Roles as last seen from the cluster.
    pub roles: LocalRoles,
    /// Curators as last seen from the cluster.
    pub directory: Vec<SocketAddr>,
}

/// The node's roles from the role names the API uses.
pub fn roles_from_names(names: &[String]) -> LocalRoles {
    LocalRoles {
        consensus_member: names.iter().any(|r| r == proto::ROLE_CONSENSUS_MEMBER),
        kubernetes_controller: names.iter().any(|r| r == proto::ROLE_KUBERNETES_CONTROLLER),
        kubernetes_worker: names.iter().any(|r| r == proto::ROLE_KUBERNETES_WORKER),
    }
}

/// Where this node looks for curators first: its own (a consensus member runs one),
/// then the cluster directory in this node's order of preference.
pub fn initial_curators(membership: &Membership, address: IpAddr) -> Vec<SocketAddr> {
    let mut endpoints = Vec::new();
    if membership.consensus_member() {
        endpoints.push(SocketAddr::new(address, rpc::CURATOR_PORT));
    }
    if let Membership::Join(j) = membership {
        for e in preferred_order(address, &j.directory) {
            if !endpoints.contains(&e) {
                endpoints.push(e);
            }
        }
    }
    endpoints
}

/// The cluster directory in the order this node tries it: spread over the curators by
/// the node's address (`rpc::spread`), so that a fleet does not pile onto the first.
pub fn preferred_order(address: IpAddr, directory: &[SocketAddr]) -> Vec<SocketAddr> {
    rpc::spread::by_preference(address.to_string().as_bytes(), directory)
}
