//! What each Kubernetes certificate says (pure): for every purpose a node may ask for,
//! its subject (Kubernetes reads the user from CN and the groups from O), its names and
//! its usage; and which Polis role maps to which Kubernetes group. The curator leader
//! issues them with the Kubernetes CA (`pki::Ca::issue_foreign`); nothing here signs.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use proto::api::KubernetesCertificatePurpose as Purpose;

/// The service IP range the apiservers allocate from (`--service-cluster-ip-range`): a
/// setting, not traffic (no packet is sent to it by Polis or its tests).
pub const SERVICE_CLUSTER_IP_RANGE: &str = "10.96.0.0/16";
/// The `kubernetes` Service's IP: the first of the range, in every serving certificate.
pub const KUBERNETES_SERVICE_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1));
/// The port every apiserver serves on, on its node's address.
pub const APISERVER_PORT: u16 = 6443;
/// Lifetime of the components' certificates unless a node asks for another (they
/// renew at 2/3 of it, online).
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// Lifetime of a person's credentials unless asked otherwise, and the most allowed.
pub const USER_LIFETIME: Duration = Duration::from_secs(8 * 3600);
pub const MAX_USER_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// The Kubernetes groups Polis keeps bindings for (`rbac`), by Polis role.
pub const GROUP_ADMINS: &str = "polis:admins";
pub const GROUP_OPERATORS: &str = "polis:operators";
pub const GROUP_READERS: &str = "polis:readers";
/// The group of the apiservers' kubelet client certificates.
pub const GROUP_APISERVERS: &str = "polis:apiservers";

/// Which CA signs a purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signer {
    Kubernetes,
    FrontProxy,
}

/// What a certificate of one purpose says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub signer: Signer,
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub server: bool,
}

/// The certificate of `purpose` for node `node_id` at `address` in a cluster whose
/// DNS domain is `domain`; `None` for an unknown purpose.
pub fn spec(purpose: Purpose, node_id: &str, address: IpAddr, domain: &str) -> Option<Spec> {
    let client = |signer, cn: &str, orgs: &[&str]| Spec {
        signer,
        common_name: cn.to_string(),
        organizations: orgs.iter().map(|o| o.to_string()).collect(),
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
        server: false,
    };
    Some(match purpose {
        Purpose::ApiserverServing => Spec {
            signer: Signer::Kubernetes,
            common_name: "kube-apiserver".into(),
            organizations: Vec::new(),
            dns_names: apiserver_names(domain),
            ip_addresses: vec![address, KUBERNETES_SERVICE_IP],
            server: true,
        },
        Purpose::ApiserverKubeletClient => client(
            Signer::Kubernetes,
            "kube-apiserver-kubelet-client",
            &[GROUP_APISERVERS],
        ),
        Purpose::ApiserverFrontProxyClient => client(Signer::FrontProxy, "front-proxy-client", &[]),
        Purpose::ControllerManager => {
            client(Signer::Kubernetes, "system:kube-controller-manager", &[])
        }
        Purpose::Scheduler => client(Signer::Kubernetes, "system:kube-scheduler", &[]),
        Purpose::PolisNodeAdmin => client(
            Signer::Kubernetes,
            &format!("polis:node:{node_id}"),
            &["system:masters"],
        ),
        // Never issued: the apiserver cannot revoke a client certificate, so a kubelet
        // proves itself with a token Polis checks (`kubelet_token`).
        Purpose::KubeletClient => return None,
        Purpose::KubeletServing => Spec {
            signer: Signer::Kubernetes,
            common_name: format!("system:node:{node_id}"),
            organizations: vec!["system:nodes".into()],
            dns_names: vec![node_id.to_string()],
            ip_addresses: vec![address],
            server: true,
        },
        Purpose::Unspecified => return None,
    })
}

/// Which role a purpose is issued for: a worker's kubelet, or a controller's
/// components (pure).
pub fn for_worker(purpose: Purpose) -> bool {
    matches!(purpose, Purpose::KubeletClient | Purpose::KubeletServing)
}

/// Why a kubelet client certificate is refused (asked for by an older node).
pub const NO_KUBELET_CLIENT_CERTIFICATE: &str = "kubelet client certificates are not issued: \
     the apiserver cannot revoke them; a kubelet authenticates with the token issued with \
     its serving certificate (upgrade polis-node on this worker)";

/// The names every apiserver serves under.
pub fn apiserver_names(domain: &str) -> Vec<String> {
    let mut names: Vec<String> = ["kubernetes", "kubernetes.default", "kubernetes.default.svc"]
        .iter()
        .map(|n| n.to_string())
        .collect();
    if !domain.is_empty() {
        names.push(format!("kubernetes.default.svc.{domain}"));
    }
    names
}

/// The Kubernetes user and group of a Polis caller: the owner and admins administer,
/// operators edit, readers view.
pub fn user_group(role: pki::OperatorRole) -> &'static str {
    match role {
        pki::OperatorRole::Admin => GROUP_ADMINS,
        pki::OperatorRole::Operator => GROUP_OPERATORS,
        pki::OperatorRole::Reader => GROUP_READERS,
    }
}

/// The lifetime a person's credentials get: `asked` seconds (0: the default), at most
/// the maximum and at least pki's minimum.
pub fn user_lifetime(asked_seconds: u64) -> Duration {
    match asked_seconds {
        0 => USER_LIFETIME,
        s => Duration::from_secs(s).clamp(pki::MIN_CERTIFICATE_LIFETIME, MAX_USER_LIFETIME),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_apiserver_serves_under_its_address_its_service_ip_and_its_names() {
        let address: IpAddr = "127.0.0.2".parse().unwrap();
        let s = spec(
            Purpose::ApiserverServing,
            "polis-a",
            address,
            "polis.internal",
        )
        .unwrap();
        assert!(s.server);
        assert_eq!(s.ip_addresses, vec![address, KUBERNETES_SERVICE_IP]);
        assert!(
            s.dns_names
                .contains(&"kubernetes.default.svc.polis.internal".to_string())
        );
        assert!(s.dns_names.contains(&"kubernetes".to_string()));
    }

    #[test]
    fn only_polis_nodes_own_credential_is_a_master() {
        let address: IpAddr = "127.0.0.2".parse().unwrap();
        for purpose in [
            Purpose::ApiserverServing,
            Purpose::ApiserverKubeletClient,
            Purpose::ApiserverFrontProxyClient,
            Purpose::ControllerManager,
            Purpose::Scheduler,
            Purpose::PolisNodeAdmin,
        ] {
            let s = spec(purpose, "polis-a", address, "").unwrap();
            assert_eq!(
                s.organizations.contains(&"system:masters".to_string()),
                purpose == Purpose::PolisNodeAdmin,
                "{purpose:?}"
            );
            assert_eq!(
                s.signer == Signer::FrontProxy,
                purpose == Purpose::ApiserverFrontProxyClient
            );
        }
        assert_eq!(spec(Purpose::Unspecified, "polis-a", address, ""), None);
        assert_eq!(spec(Purpose::KubeletClient, "polis-a", address, ""), None);
        assert!(for_worker(Purpose::KubeletServing) && !for_worker(Purpose::ApiserverServing));
        let serving = spec(Purpose::KubeletServing, "polis-a", address, "").unwrap();
        assert!(serving.server && serving.ip_addresses == vec![address]);
    }

    #[test]
    fn roles_map_to_groups_and_lifetimes_are_bounded() {
        assert_eq!(user_group(pki::OperatorRole::Admin), GROUP_ADMINS);
        assert_eq!(user_group(pki::OperatorRole::Reader), GROUP_READERS);
        assert_eq!(user_lifetime(0), USER_LIFETIME);
        assert_eq!(user_lifetime(u64::MAX), MAX_USER_LIFETIME);
        assert_eq!(user_lifetime(1), pki::MIN_CERTIFICATE_LIFETIME);
    }
}
