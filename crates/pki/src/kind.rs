//! The kind mark ([`CertificateKind`]): what a certificate's holder is, written into
//! and read back from the subject's organizational unit.
//!
//! A leaf: pure; may not issue.

/// What a certificate's holder is, written by the CA into the subject as the
/// organizational unit `polis:<kind>` (exactly one). Clients are classified from this
/// mark alone (see `rpc::tls`): a cluster certificate without a known mark is denied,
/// so a new kind of certificate never inherits another kind's permissions by accident.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertificateKind {
    /// A node: the common name is the node ID of the certified key.
    Node,
    /// A cluster owner (an operator): may manage the cluster.
    Owner,
    /// An etcd member talking to its peers (etcd peer CA only).
    EtcdPeer,
    /// A curator serving its gRPC listener: only consensus members get one (for their
    /// node key), and lose it (revoked) with the role. Clients accept no other kind from
    /// a curator; servers accept it from no client.
    Curator,
}

impl CertificateKind {
    pub(crate) const ALL: [CertificateKind; 4] = [
        CertificateKind::Node,
        CertificateKind::Owner,
        CertificateKind::EtcdPeer,
        CertificateKind::Curator,
    ];

    /// The organizational unit that marks this kind.
    pub const fn mark(self) -> &'static str {
        match self {
            CertificateKind::Node => "polis:node",
            CertificateKind::Owner => "polis:owner",
            CertificateKind::EtcdPeer => "polis:etcd-peer",
            CertificateKind::Curator => "polis:curator",
        }
    }

    pub fn from_mark(mark: &str) -> Option<CertificateKind> {
        Self::ALL.into_iter().find(|k| k.mark() == mark)
    }

    /// The kind a parsed certificate is marked with: `None` unless its subject holds
    /// exactly one organizational unit and that unit is a known mark.
    pub fn of(cert: &x509_parser::certificate::X509Certificate<'_>) -> Option<CertificateKind> {
        let mut units = cert.subject().iter_organizational_unit();
        let only = units.next()?;
        if units.next().is_some() {
            return None;
        }
        CertificateKind::from_mark(only.as_str().ok()?)
    }
}
