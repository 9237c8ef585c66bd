//! What the cluster's certificates say and how long they live: the templates the
//! cluster CA and the etcd peer CA issue from, and the lifetimes a cluster
//! configuration sets.
//!
//! Pure: may not do I/O nor import any other module of this crate.

use proto::config::ClusterConfiguration;

/// The node certificate a node gets from the cluster CA: names its ID (DNS) and its
/// address (IP); it serves the curator and authenticates the node as a client.
pub fn node_certificate_template(
    node_id: &str,
    address: std::net::IpAddr,
    lifetime: std::time::Duration,
) -> pki::Template {
    pki::Template {
        common_name: node_id.to_string(),
        dns_names: vec![node_id.to_string()],
        ip_addresses: vec![address],
        usage: pki::Usage::ServerAndClient,
        lifetime,
        kind: pki::CertificateKind::Node,
    }
}

/// The certificate etcd peers know a node by, from the etcd peer CA. Loopback addresses
/// also get 127.0.0.1: Linux sources connections between 127.0.0.x aliases from
/// 127.0.0.1, and etcd checks the dialing peer's SAN against the source address.
pub fn peer_certificate_template(
    node_id: &str,
    address: std::net::IpAddr,
    lifetime: std::time::Duration,
) -> pki::Template {
    let mut ips = vec![address];
    let localhost: std::net::IpAddr = [127, 0, 0, 1].into();
    if address.is_loopback() && address != localhost {
        ips.push(localhost);
    }
    pki::Template {
        common_name: node_id.to_string(),
        dns_names: vec![node_id.to_string()],
        ip_addresses: ips,
        usage: pki::Usage::ServerAndClient,
        lifetime,
        kind: pki::CertificateKind::EtcdPeer,
    }
}

/// The curator certificate a consensus member serves its curator with: for its node
/// key, naming its ID (DNS) and address (IP); a server certificate only.
pub fn curator_certificate_template(
    node_id: &str,
    address: std::net::IpAddr,
    lifetime: std::time::Duration,
) -> pki::Template {
    pki::Template {
        common_name: node_id.to_string(),
        dns_names: vec![node_id.to_string()],
        ip_addresses: vec![address],
        usage: pki::Usage::Server,
        lifetime,
        kind: pki::CertificateKind::Curator,
    }
}

/// The owner certificate (Escrow): a client certificate that names no node.
pub fn owner_certificate_template(lifetime: std::time::Duration) -> pki::Template {
    pki::Template {
        common_name: "owner".into(),
        dns_names: vec![],
        ip_addresses: vec![],
        usage: pki::Usage::Client,
        lifetime,
        kind: pki::CertificateKind::Owner,
    }
}

/// An operator's certificate (Escrow): a client certificate naming the operator, marked
/// with its role. Its lifetime is the owner certificates'.
pub fn operator_certificate_template(
    name: &str,
    role: pki::OperatorRole,
    lifetime: std::time::Duration,
) -> pki::Template {
    pki::Template {
        common_name: name.to_string(),
        dns_names: vec![],
        ip_addresses: vec![],
        usage: pki::Usage::Client,
        lifetime,
        kind: pki::CertificateKind::Operator(role),
    }
}

/// Lifetime of node and etcd peer certificates under `configuration` (0 or absent: the
/// default, a year).
pub fn node_certificate_lifetime(
    configuration: Option<&ClusterConfiguration>,
) -> std::time::Duration {
    match configuration.map(|c| c.node_certificate_lifetime_seconds) {
        None | Some(0) => pki::CERTIFICATE_LIFETIME,
        Some(s) => std::time::Duration::from_secs(s),
    }
}

/// Lifetime of owner certificates under `configuration` (0 or absent: 30 days).
pub fn owner_certificate_lifetime(
    configuration: Option<&ClusterConfiguration>,
) -> std::time::Duration {
    match configuration.map(|c| c.owner_certificate_lifetime_seconds) {
        None | Some(0) => pki::OWNER_CERTIFICATE_LIFETIME,
        Some(s) => std::time::Duration::from_secs(s),
    }
}

/// Checks the certificate lifetimes a cluster configuration asks for (bootstrap
/// parameters are refused before anything is written when they fail this).
pub fn check_configuration(configuration: &ClusterConfiguration) -> Result<(), pki::PkiError> {
    pki::check_lifetime(node_certificate_lifetime(Some(configuration)))?;
    pki::check_lifetime(owner_certificate_lifetime(Some(configuration)))
}
