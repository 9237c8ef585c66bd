//! Who may call what: the permission table and the decision (pure, no I/O).

use std::fmt;

pub use pki::OperatorRole;

/// What an RPC requires of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// Anyone, with or without a client certificate (but not with an invalid one).
    Public,
    /// A self-signed client certificate: the caller proves a key, nothing more.
    ProvenKey,
    /// Read cluster state: nodes and every user (the owner and operators of any role).
    ReadClusterStatus,
    /// A node updating its own status: nodes only.
    UpdateNodeSelf,
    /// Read what only users see (certificates, tickets, operators): every user, from
    /// the `reader` role up.
    Read,
    /// Run the nodes (approve, label, roles, decommission, delete, snapshot schedule,
    /// audit log, node logs): the `operator` role and up.
    Operate,
    /// What can sign or hand out credentials (backups and snapshots, which hold the
    /// cluster CA's key; operators; register tickets; the owner key): `admin` and the
    /// owner.
    Administer,
}

impl Permission {
    /// The least operator role a user needs for this permission; `None` when users
    /// do not get it by role (public, proven key, nodes only).
    pub const fn least_role(self) -> Option<OperatorRole> {
        match self {
            Permission::ReadClusterStatus | Permission::Read => Some(OperatorRole::Reader),
            Permission::Operate => Some(OperatorRole::Operator),
            Permission::Administer => Some(OperatorRole::Admin),
            Permission::Public | Permission::ProvenKey | Permission::UpdateNodeSelf => None,
        }
    }
}

/// The caller, as established from its TLS client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// No client certificate.
    Anonymous,
    /// A self-signed certificate; the TLS handshake proved possession of this key.
    SelfSigned { public_key: Vec<u8> },
    /// A node certificate from the cluster CA.
    Node { id: String, public_key: Vec<u8> },
    /// The owner's certificate from the cluster CA (the name is always "owner"): an
    /// admin that no operator removal reaches.
    User { name: String, public_key: Vec<u8> },
    /// A named operator's certificate from the cluster CA, with the role it marks.
    Operator {
        name: String,
        role: OperatorRole,
        public_key: Vec<u8>,
    },
    /// A certificate that is neither self-signed nor valid in this cluster: expired,
    /// revoked, from another CA, or malformed.
    Invalid { reason: String },
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Anonymous => f.write_str("anonymous"),
            Identity::SelfSigned { public_key } => {
                write!(
                    f,
                    "self-signed key {}",
                    hex::encode(&public_key[..public_key.len().min(8)])
                )
            }
            Identity::Node { id, .. } => write!(f, "node {id}"),
            Identity::User { name, .. } => write!(f, "user {name}"),
            Identity::Operator { name, role, .. } => write!(f, "operator {name} ({role})"),
            Identity::Invalid { reason } => write!(f, "invalid certificate ({reason})"),
        }
    }
}

impl Identity {
    /// The operator role this caller holds: the owner is an admin, an operator holds
    /// its certificate's role, nobody else holds one.
    pub fn role(&self) -> Option<OperatorRole> {
        match self {
            Identity::User { .. } => Some(OperatorRole::Admin),
            Identity::Operator { role, .. } => Some(*role),
            _ => None,
        }
    }

    /// Whether this caller is a user (the owner or an operator of any role).
    pub fn is_user(&self) -> bool {
        self.role().is_some()
    }

    /// Whether this caller holds at least `role`.
    pub fn holds(&self, role: OperatorRole) -> bool {
        self.role().is_some_and(|r| r >= role)
    }
}

/// Every RPC Polis serves, with its permission. An RPC that is not listed is denied.
pub const METHODS: &[(&str, Permission)] = &[
    (
        "/polis.api.CuratorLocal/GetCurrentLeader",
        Permission::Public,
    ),
    (
        "/polis.api.CuratorLocal/GetCACertificate",
        Permission::Public,
    ),
    (
        "/polis.api.CuratorLocal/GetConsensusStatus",
        Permission::ReadClusterStatus,
    ),
    ("/polis.api.AAA/Escrow", Permission::ProvenKey),
    (
        "/polis.api.Management/GetClusterInfo",
        Permission::ReadClusterStatus,
    ),
    (
        "/polis.api.Management/ListNodes",
        Permission::ReadClusterStatus,
    ),
    (
        "/polis.api.Management/DescribeNode",
        Permission::ReadClusterStatus,
    ),
    (
        "/polis.api.Management/UpdateNodeLabels",
        Permission::Operate,
    ),
    (
        "/polis.api.Management/GetRegisterTicket",
        Permission::Administer,
    ),
    (
        "/polis.api.Management/RotateRegisterTicket",
        Permission::Administer,
    ),
    ("/polis.api.Management/ApproveNode", Permission::Operate),
    // The handler also requires an admin to grant ConsensusMember: a member's etcd
    // holds the cluster CA's key.
    ("/polis.api.Management/UpdateNodeRoles", Permission::Operate),
    (
        "/polis.api.Management/DecommissionNode",
        Permission::Operate,
    ),
    ("/polis.api.Management/DeleteNode", Permission::Operate),
    ("/polis.api.Management/ListCertificates", Permission::Read),
    // The handler also requires the owner itself: an admin holding the owner key
    // would be an owner no operator removal reaches.
    ("/polis.api.Management/RotateOwner", Permission::Administer),
    // Replacing the cluster CA: every certificate is re-issued; its state is for all.
    ("/polis.api.Management/RotateCa", Permission::Administer),
    ("/polis.api.Management/GetCaRotation", Permission::Read),
    // Operators: listed by every user, added and removed by admins.
    ("/polis.api.Management/AddOperator", Permission::Administer),
    ("/polis.api.Management/ListOperators", Permission::Read),
    (
        "/polis.api.Management/RemoveOperator",
        Permission::Administer,
    ),
    // The handler also requires the ConsensusMember role of the calling node.
    (
        "/polis.api.Curator/JoinConsensus",
        Permission::UpdateNodeSelf,
    ),
    ("/polis.api.Curator/Heartbeat", Permission::UpdateNodeSelf),
    ("/polis.api.Curator/WatchNode", Permission::UpdateNodeSelf),
    (
        "/polis.api.Curator/RenewCertificates",
        Permission::UpdateNodeSelf,
    ),
    // A registering node has no certificate but a self-signed one for its key.
    ("/polis.api.Curator/RegisterNode", Permission::ProvenKey),
    ("/polis.api.Curator/CommitNode", Permission::ProvenKey),
    // A node that missed a CA rotation: its node key, and its certificate of the
    // retired CA in the request (checked by the handler).
    (
        "/polis.api.Curator/ReissueNodeCertificate",
        Permission::ProvenKey,
    ),
    ("/polis.api.DataUnlock/UnlockData", Permission::ProvenKey),
    // etcd upkeep: the curator leader asks a member's curator to defragment its own
    // etcd member; the handler also requires an UP ConsensusMember caller.
    (
        "/polis.api.CuratorLocal/DefragmentMember",
        Permission::UpdateNodeSelf,
    ),
    // Answered by the curator called, from its own etcd member (never forwarded). A
    // backup holds the cluster CA's private key: admins only.
    ("/polis.api.Backup/TakeBackup", Permission::Administer),
    // Scheduled snapshots: an owner lists and fetches them through any curator (never
    // forwarded), which asks the member's curator (nodes; the handler also requires an
    // UP ConsensusMember caller); the owner changes the schedule (leader).
    ("/polis.api.Backup/ListSnapshots", Permission::Operate),
    // A snapshot holds the cluster CA's private key, as a backup does.
    ("/polis.api.Backup/FetchSnapshot", Permission::Administer),
    (
        "/polis.api.CuratorLocal/SnapshotsListLocal",
        Permission::UpdateNodeSelf,
    ),
    (
        "/polis.api.CuratorLocal/SnapshotsFetchLocal",
        Permission::UpdateNodeSelf,
    ),
    (
        "/polis.api.Management/SetSnapshotSchedule",
        Permission::Operate,
    ),
    // The audit log: who changed what (see NOT_AUDITED for what is not recorded).
    ("/polis.api.Audit/AuditLog", Permission::Operate),
    // Served by every node on its own port (NODE_LOGS_PORT): its own log lines.
    ("/polis.api.NodeLogs/NodeLogsTail", Permission::Operate),
    // Register tickets: created and revoked by admins, listed (never a secret) by users.
    (
        "/polis.api.Management/CreateRegisterTicket",
        Permission::Administer,
    ),
    (
        "/polis.api.Management/ListRegisterTickets",
        Permission::Read,
    ),
    (
        "/polis.api.Management/RevokeRegisterTicket",
        Permission::Administer,
    ),
    // Kubernetes: a person's client certificate, its group from the caller's role (so
    // a reader gets one that only views); audited, as every credential handed out is.
    (
        "/polis.api.Management/IssueKubernetesCredentials",
        Permission::Read,
    ),
    // The handler also requires the KubernetesController role of the calling node.
    (
        "/polis.api.Curator/IssueKubernetesCertificates",
        Permission::UpdateNodeSelf,
    ),
];

/// Audited calls a reader may make: they change nothing, but hand out a credential
/// (whose power is the caller's own), and who got one is worth recording.
pub const AUDITED_READS: &[&str] = &["/polis.api.Management/IssueKubernetesCredentials"];

/// The declared RPCs that do not change cluster state (or, for Heartbeat, only a
/// node's own status every few seconds): not recorded in the audit log. Every other
/// declared RPC is, so a new RPC is audited unless it is listed here.
pub const NOT_AUDITED: &[&str] = &[
    "/polis.api.CuratorLocal/GetCurrentLeader",
    "/polis.api.CuratorLocal/GetCACertificate",
    "/polis.api.CuratorLocal/GetConsensusStatus",
    "/polis.api.Management/GetClusterInfo",
    "/polis.api.Management/ListNodes",
    "/polis.api.Management/DescribeNode",
    "/polis.api.Management/ListCertificates",
    "/polis.api.Management/ListRegisterTickets",
    "/polis.api.Management/ListOperators",
    "/polis.api.Management/GetCaRotation",
    "/polis.api.Curator/Heartbeat",
    "/polis.api.Curator/WatchNode",
    "/polis.api.Audit/AuditLog",
    "/polis.api.NodeLogs/NodeLogsTail",
    "/polis.api.Backup/ListSnapshots",
    "/polis.api.CuratorLocal/SnapshotsListLocal",
    // The relay behind Backup/FetchSnapshot, which is recorded.
    "/polis.api.CuratorLocal/SnapshotsFetchLocal",
];

/// Whether calls of `method` are recorded in the audit log: every declared RPC but
/// those in [`NOT_AUDITED`].
pub fn audited(method: &str) -> bool {
    permission(method).is_some() && !NOT_AUDITED.contains(&method)
}

/// Why a call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("{method} is not a declared RPC")]
    UndeclaredMethod { method: String },
    #[error("client certificate rejected: {reason}")]
    InvalidCertificate { reason: String },
    #[error("{method} requires {needed:?}; caller is {caller}")]
    Insufficient {
        method: String,
        needed: Permission,
        caller: String,
    },
}

/// The permission declared for `method`, if any.
pub fn permission(method: &str) -> Option<Permission> {
    METHODS.iter().find(|(m, _)| *m == method).map(|(_, p)| *p)
}

/// Decides whether `identity` may call `method`.
pub fn authorize(method: &str, identity: &Identity) -> Result<(), Denied> {
    let needed = permission(method).ok_or_else(|| Denied::UndeclaredMethod {
        method: method.to_string(),
    })?;
    if let Identity::Invalid { reason } = identity {
        return Err(Denied::InvalidCertificate {
            reason: reason.clone(),
        });
    }
    let allowed = match needed {
        Permission::Public => true,
        Permission::ProvenKey => matches!(identity, Identity::SelfSigned { .. }),
        Permission::ReadClusterStatus => {
            matches!(identity, Identity::Node { .. }) || identity.is_user()
        }
        Permission::UpdateNodeSelf => matches!(identity, Identity::Node { .. }),
        Permission::Read | Permission::Operate | Permission::Administer => needed
            .least_role()
            .is_some_and(|least| identity.holds(least)),
    };
    if allowed {
        Ok(())
    } else {
        Err(Denied::Insufficient {
            method: method.to_string(),
            needed,
            caller: identity.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identities() -> Vec<(&'static str, Identity)> {
        vec![
            ("anonymous", Identity::Anonymous),
            (
                "self-signed",
                Identity::SelfSigned {
                    public_key: vec![1; 32],
                },
            ),
            (
                "node",
                Identity::Node {
                    id: "polis-x".into(),
                    public_key: vec![2; 32],
                },
            ),
            (
                "owner",
                Identity::User {
                    name: "owner".into(),
                    public_key: vec![3; 32],
                },
            ),
            (
                "admin",
                Identity::Operator {
                    name: "ada".into(),
                    role: OperatorRole::Admin,
                    public_key: vec![4; 32],
                },
            ),
            (
                "operator",
                Identity::Operator {
                    name: "otto".into(),
                    role: OperatorRole::Operator,
                    public_key: vec![5; 32],
                },
            ),
            (
                "reader",
                Identity::Operator {
                    name: "rita".into(),
                    role: OperatorRole::Reader,
                    public_key: vec![6; 32],
                },
            ),
            (
                "invalid",
                Identity::Invalid {
                    reason: "expired".into(),
                },
            ),
        ]
    }

    /// Every caller that holds `least` or more.
    const USERS: &[&str] = &["owner", "admin", "operator", "reader"];
    const OPERATORS: &[&str] = &["owner", "admin", "operator"];
    const ADMINS: &[&str] = &["owner", "admin"];

    fn with<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<&'a str> {
        a.iter().chain(b).copied().collect()
    }

    fn check(method: &str, allowed: &[&str]) {
        for (name, identity) in identities() {
            let got = authorize(method, &identity).is_ok();
            assert_eq!(got, allowed.contains(&name), "{method} × {name}");
        }
    }

    #[test]
    fn matrix() {
        let public = ["anonymous", "self-signed", "node"];
        check(
            "/polis.api.CuratorLocal/GetCurrentLeader",
            &with(&public, USERS),
        );
        check(
            "/polis.api.CuratorLocal/GetCACertificate",
            &with(&public, USERS),
        );
        check("/polis.api.AAA/Escrow", &["self-signed"]);
        let read_status = with(&["node"], USERS);
        check("/polis.api.Management/GetClusterInfo", &read_status);
        check("/polis.api.Management/ListNodes", &read_status);
        check("/polis.api.Management/DescribeNode", &read_status);
        check("/polis.api.CuratorLocal/GetConsensusStatus", &read_status);
        check("/polis.api.Management/ListCertificates", USERS);
        check("/polis.api.Management/ListRegisterTickets", USERS);
        check("/polis.api.Management/ListOperators", USERS);
        check("/polis.api.Management/AddOperator", ADMINS);
        check("/polis.api.Management/RemoveOperator", ADMINS);
        check("/polis.api.Management/UpdateNodeLabels", OPERATORS);
        check("/polis.api.Management/ApproveNode", OPERATORS);
        check("/polis.api.Management/UpdateNodeRoles", OPERATORS);
        check("/polis.api.Management/DecommissionNode", OPERATORS);
        check("/polis.api.Management/DeleteNode", OPERATORS);
        check("/polis.api.Management/SetSnapshotSchedule", OPERATORS);
        check("/polis.api.Backup/ListSnapshots", OPERATORS);
        check("/polis.api.Audit/AuditLog", OPERATORS);
        check("/polis.api.NodeLogs/NodeLogsTail", OPERATORS);
        check("/polis.api.Management/GetRegisterTicket", ADMINS);
        check("/polis.api.Management/RotateRegisterTicket", ADMINS);
        check("/polis.api.Management/CreateRegisterTicket", ADMINS);
        check("/polis.api.Management/RevokeRegisterTicket", ADMINS);
        check("/polis.api.Management/RotateOwner", ADMINS);
        check("/polis.api.Management/RotateCa", ADMINS);
        check("/polis.api.Management/GetCaRotation", USERS);
        check("/polis.api.Backup/TakeBackup", ADMINS);
        check("/polis.api.Backup/FetchSnapshot", ADMINS);
        check("/polis.api.Curator/JoinConsensus", &["node"]);
        check("/polis.api.Curator/Heartbeat", &["node"]);
        check("/polis.api.Curator/WatchNode", &["node"]);
        check("/polis.api.Curator/RenewCertificates", &["node"]);
        check("/polis.api.Curator/IssueKubernetesCertificates", &["node"]);
        check("/polis.api.Management/IssueKubernetesCredentials", USERS);
        check("/polis.api.Curator/RegisterNode", &["self-signed"]);
        check("/polis.api.Curator/CommitNode", &["self-signed"]);
        check("/polis.api.DataUnlock/UnlockData", &["self-signed"]);
        check("/polis.api.CuratorLocal/SnapshotsListLocal", &["node"]);
        check("/polis.api.CuratorLocal/SnapshotsFetchLocal", &["node"]);
        check("/polis.api.CuratorLocal/DefragmentMember", &["node"]);
    }

    #[test]
    fn the_owner_keeps_every_permission_it_had() {
        let owner = Identity::User {
            name: "owner".into(),
            public_key: vec![3; 32],
        };
        for (method, needed) in METHODS {
            let had = matches!(needed, Permission::Public | Permission::ReadClusterStatus)
                || needed.least_role().is_some();
            assert_eq!(authorize(method, &owner).is_ok(), had, "{method}");
        }
    }

    #[test]
    fn a_reader_changes_nothing() {
        let reader = Identity::Operator {
            name: "rita".into(),
            role: OperatorRole::Reader,
            public_key: vec![6; 32],
        };
        for (method, _) in METHODS {
            if authorize(method, &reader).is_ok() && !AUDITED_READS.contains(method) {
                assert!(
                    !audited(method),
                    "a reader may call {method}, which changes the cluster"
                );
            }
        }
    }

    #[test]
    fn every_state_changing_rpc_is_audited_and_reads_are_not() {
        for method in NOT_AUDITED {
            assert!(permission(method).is_some(), "{method} is not declared");
        }
        let mut audited: Vec<&str> = METHODS
            .iter()
            .map(|(m, _)| *m)
            .filter(|m| super::audited(m))
            .collect();
        audited.sort();
        assert_eq!(
            audited,
            [
                "/polis.api.AAA/Escrow",
                "/polis.api.Backup/FetchSnapshot",
                "/polis.api.Backup/TakeBackup",
                "/polis.api.Curator/CommitNode",
                "/polis.api.Curator/IssueKubernetesCertificates",
                "/polis.api.Curator/JoinConsensus",
                "/polis.api.Curator/RegisterNode",
                "/polis.api.Curator/ReissueNodeCertificate",
                "/polis.api.Curator/RenewCertificates",
                "/polis.api.CuratorLocal/DefragmentMember",
                "/polis.api.DataUnlock/UnlockData",
                "/polis.api.Management/AddOperator",
                "/polis.api.Management/ApproveNode",
                "/polis.api.Management/CreateRegisterTicket",
                "/polis.api.Management/DecommissionNode",
                "/polis.api.Management/DeleteNode",
                "/polis.api.Management/GetRegisterTicket",
                "/polis.api.Management/IssueKubernetesCredentials",
                "/polis.api.Management/RemoveOperator",
                "/polis.api.Management/RevokeRegisterTicket",
                "/polis.api.Management/RotateCa",
                "/polis.api.Management/RotateOwner",
                "/polis.api.Management/RotateRegisterTicket",
                "/polis.api.Management/SetSnapshotSchedule",
                "/polis.api.Management/UpdateNodeLabels",
                "/polis.api.Management/UpdateNodeRoles",
            ]
        );
        assert!(!super::audited("/polis.api.Management/DeleteEverything"));
    }

    #[test]
    fn self_signed_callers_reach_only_local_escrow_registration_and_reissue() {
        let caller = Identity::SelfSigned {
            public_key: vec![1; 32],
        };
        let mut allowed: Vec<&str> = METHODS
            .iter()
            .map(|(m, _)| *m)
            .filter(|m| authorize(m, &caller).is_ok())
            .collect();
        allowed.sort();
        assert_eq!(
            allowed,
            [
                "/polis.api.AAA/Escrow",
                "/polis.api.Curator/CommitNode",
                "/polis.api.Curator/RegisterNode",
                "/polis.api.Curator/ReissueNodeCertificate",
                "/polis.api.CuratorLocal/GetCACertificate",
                "/polis.api.CuratorLocal/GetCurrentLeader",
                "/polis.api.DataUnlock/UnlockData",
            ]
        );
    }

    #[test]
    fn the_table_names_exactly_the_rpcs_in_the_protos() {
        use prost::Message;
        let set = prost_types::FileDescriptorSet::decode(proto::FILE_DESCRIPTOR_SET)
            .expect("the build's descriptor set decodes");
        let mut declared: Vec<String> = set
            .file
            .iter()
            .flat_map(|f| {
                f.service.iter().flat_map(move |s| {
                    s.method
                        .iter()
                        .map(move |m| format!("/{}.{}/{}", f.package(), s.name(), m.name()))
                })
            })
            .collect();
        declared.sort();
        let mut table: Vec<String> = METHODS.iter().map(|(m, _)| m.to_string()).collect();
        table.sort();
        assert_eq!(table, declared);
    }

    #[test]
    fn undeclared_methods_are_denied_for_everyone() {
        check("/polis.api.Management/DeleteEverything", &[]);
        check("", &[]);
        assert!(matches!(
            authorize(
                "/x/Y",
                &Identity::User {
                    name: "owner".into(),
                    public_key: vec![]
                }
            ),
            Err(Denied::UndeclaredMethod { .. })
        ));
    }

    #[test]
    fn method_table_has_no_duplicates() {
        let mut names: Vec<_> = METHODS.iter().map(|(m, _)| *m).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), METHODS.len());
    }
}
