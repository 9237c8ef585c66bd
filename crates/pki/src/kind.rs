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
    /// A named operator (not the owner) with a role: the common name is the operator's
    /// name. Marked `polis:reader`, `polis:operator` or `polis:admin`. Earlier versions
    /// know none of these marks and deny them.
    Operator(OperatorRole),
}

/// What an operator may do, each role all of the one before it: a reader reads, an
/// operator also runs the nodes, an admin also holds what can sign or hand out
/// credentials (backups, operators, tickets). The owner is an admin.
///
/// The role is marked in the certificate rather than looked up per call, so every
/// node's own log server can authorize it too, without the operator records. A role
/// change is a removal and an addition, which revokes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OperatorRole {
    Reader,
    Operator,
    Admin,
}

impl OperatorRole {
    pub const ALL: [OperatorRole; 3] = [
        OperatorRole::Reader,
        OperatorRole::Operator,
        OperatorRole::Admin,
    ];

    /// The role's name, as the CLI, the records and the marks spell it.
    pub const fn name(self) -> &'static str {
        match self {
            OperatorRole::Reader => "reader",
            OperatorRole::Operator => "operator",
            OperatorRole::Admin => "admin",
        }
    }

    /// The role named `name` (exactly as [`OperatorRole::name`] spells it).
    pub fn from_name(name: &str) -> Option<OperatorRole> {
        Self::ALL.into_iter().find(|r| r.name() == name)
    }
}

impl std::fmt::Display for OperatorRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl CertificateKind {
    pub(crate) const ALL: [CertificateKind; 7] = [
        CertificateKind::Node,
        CertificateKind::Owner,
        CertificateKind::EtcdPeer,
        CertificateKind::Curator,
        CertificateKind::Operator(OperatorRole::Reader),
        CertificateKind::Operator(OperatorRole::Operator),
        CertificateKind::Operator(OperatorRole::Admin),
    ];

    /// The organizational unit that marks this kind.
    pub const fn mark(self) -> &'static str {
        match self {
            CertificateKind::Node => "polis:node",
            CertificateKind::Owner => "polis:owner",
            CertificateKind::EtcdPeer => "polis:etcd-peer",
            CertificateKind::Curator => "polis:curator",
            CertificateKind::Operator(OperatorRole::Reader) => "polis:reader",
            CertificateKind::Operator(OperatorRole::Operator) => "polis:operator",
            CertificateKind::Operator(OperatorRole::Admin) => "polis:admin",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mark_reads_back_as_its_kind_and_no_two_share_one() {
        let mut marks: Vec<_> = CertificateKind::ALL.iter().map(|k| k.mark()).collect();
        for kind in CertificateKind::ALL {
            assert_eq!(CertificateKind::from_mark(kind.mark()), Some(kind));
        }
        marks.sort();
        marks.dedup();
        assert_eq!(marks.len(), CertificateKind::ALL.len());
        assert_eq!(CertificateKind::from_mark("polis:root"), None);
    }

    #[test]
    fn roles_are_ordered_and_named() {
        assert!(OperatorRole::Reader < OperatorRole::Operator);
        assert!(OperatorRole::Operator < OperatorRole::Admin);
        for role in OperatorRole::ALL {
            assert_eq!(OperatorRole::from_name(role.name()), Some(role));
        }
        assert_eq!(OperatorRole::from_name("Admin"), None);
        assert_eq!(OperatorRole::from_name("owner"), None);
    }
}
