//! The components' configuration (pure): the files a controller node keeps under its
//! Kubernetes folder, each component's flags, the kubeconfigs, and the RBAC bindings
//! Polis keeps. Nothing here starts anything or touches the disk.
//!
//! ```text
//!   DIR/ (0700)  ca.pem front-proxy-ca.pem sa.key sa.pub
//!                apiserver.{pem,key} kubelet-client.{pem,key} front-proxy-client.{pem,key}
//!                controller-manager.{pem,key,kubeconfig} scheduler.{pem,key,kubeconfig}
//!                polis-admin.{pem,key,kubeconfig}   etcd.sock (the etcd proxy)
//!                token-webhook.kubeconfig (the apiserver → Polis's kubelet token check)
//!                controller-manager/ scheduler/ (their own serving certificates)
//! ```

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use crate::certs::{APISERVER_PORT, SERVICE_CLUSTER_IP_RANGE};

/// Where a controller node's Kubernetes files are, and what it serves on.
#[derive(Debug, Clone)]
pub struct Layout {
    pub dir: PathBuf,
    pub address: IpAddr,
    pub cluster_domain: String,
}

impl Layout {
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn arg(&self, flag: &str, name: &str) -> String {
        format!("--{flag}={}", self.path(name).display())
    }

    /// The etcd proxy's socket (`etcdproxy`).
    pub fn etcd_socket(&self) -> PathBuf {
        self.path("etcd.sock")
    }

    /// This node's apiserver.
    pub fn apiserver_url(&self) -> String {
        format!("https://{}", SocketAddr::new(self.address, APISERVER_PORT))
    }

    pub fn apiserver_args(&self) -> Vec<String> {
        let address = self.address.to_string();
        let issuer = if self.cluster_domain.is_empty() {
            "https://kubernetes.default.svc".to_string()
        } else {
            format!("https://kubernetes.default.svc.{}", self.cluster_domain)
        };
        let mut args = vec![
            format!("--bind-address={address}"),
            format!("--advertise-address={address}"),
            format!("--secure-port={APISERVER_PORT}"),
            // Through Polis's namespacing proxy only: never the etcd member itself.
            format!("--etcd-servers=unix://{}", self.etcd_socket().display()),
            // One owner of compaction: Polis's etcd upkeep (the proxy refuses Compact).
            "--etcd-compaction-interval=0".into(),
            self.arg("client-ca-file", "ca.pem"),
            self.arg("tls-cert-file", "apiserver.pem"),
            self.arg("tls-private-key-file", "apiserver.key"),
            self.arg("kubelet-client-certificate", "kubelet-client.pem"),
            self.arg("kubelet-client-key", "kubelet-client.key"),
            self.arg("service-account-key-file", "sa.pub"),
            self.arg("service-account-signing-key-file", "sa.key"),
            format!("--service-account-issuer={issuer}"),
            format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            "--anonymous-auth=false".into(),
            "--profiling=false".into(),
            self.arg("requestheader-client-ca-file", "front-proxy-ca.pem"),
            "--requestheader-allowed-names=front-proxy-client".into(),
            "--requestheader-username-headers=X-Remote-User".into(),
            "--requestheader-group-headers=X-Remote-Group".into(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
            self.arg("proxy-client-cert-file", "front-proxy-client.pem"),
            self.arg("proxy-client-key-file", "front-proxy-client.key"),
            self.arg("cert-dir", "apiserver"),
            // Kubelets hold tokens Polis checks (`tokenreview`), not certificates.
            self.arg(
                "authentication-token-webhook-config-file",
                "token-webhook.kubeconfig",
            ),
            format!(
                "--authentication-token-webhook-cache-ttl={}s",
                crate::kubelet_token::TOKEN_CACHE_TTL.as_secs()
            ),
            "--authentication-token-webhook-version=v1".into(),
        ];
        // The lease endpoint reconciler refuses loopback addresses (local clusters):
        // then the `kubernetes` Service has no endpoints; real machines keep it.
        if self.address.is_loopback() {
            args.push("--endpoint-reconciler-type=none".into());
        }
        args
    }

    /// kube-controller-manager's and kube-scheduler's flags: their kubeconfig for
    /// everything, their serving port on this node's address, leader election on.
    fn client_component_args(&self, name: &str, port: u16) -> Vec<String> {
        let kubeconfig = format!("{name}.kubeconfig");
        vec![
            self.arg("kubeconfig", &kubeconfig),
            self.arg("authentication-kubeconfig", &kubeconfig),
            self.arg("authorization-kubeconfig", &kubeconfig),
            format!("--bind-address={}", self.address),
            format!("--secure-port={port}"),
            self.arg("cert-dir", name),
            "--leader-elect=true".into(),
            "--profiling=false".into(),
        ]
    }

    pub fn controller_manager_args(&self) -> Vec<String> {
        let mut args = self.client_component_args("controller-manager", 10257);
        args.extend([
            self.arg("service-account-private-key-file", "sa.key"),
            self.arg("root-ca-file", "ca.pem"),
            "--use-service-account-credentials=true".into(),
        ]);
        args
    }

    pub fn scheduler_args(&self) -> Vec<String> {
        self.client_component_args("scheduler", 10259)
    }

    /// A kubeconfig for this node's apiserver with the files `user`.pem/.key.
    pub fn kubeconfig(&self, user: &str) -> String {
        kubeconfig_text(
            &self.apiserver_url(),
            &quoted(&self.path("ca.pem")),
            user,
            &quoted(&self.path(&format!("{user}.pem"))),
            &quoted(&self.path(&format!("{user}.key"))),
        )
    }
}

impl Layout {
    /// The apiserver's kubeconfig for Polis's token webhook (`tokenreview`) on this
    /// node's loopback, whose certificate is the apiserver's own.
    pub fn token_webhook_kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: polis\n  cluster:\n    \
             certificate-authority: {ca}\n    server: https://{address}{path}\n    \
             tls-server-name: kubernetes\nusers:\n- name: apiserver\n  user: {{}}\n\
             contexts:\n- name: polis\n  context:\n    cluster: polis\n    user: apiserver\n\
             current-context: polis\n",
            ca = quoted(&self.path("ca.pem")),
            address = crate::tokenreview::webhook_address(self.address),
            path = crate::tokenreview::WEBHOOK_PATH,
        )
    }
}

fn quoted(path: &Path) -> String {
    serde_json::to_string(&path.display().to_string()).expect("a string serializes")
}

fn kubeconfig_text(server: &str, ca: &str, user: &str, cert: &str, key: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: polis\n  cluster:\n    \
         certificate-authority: {ca}\n    server: {server}\nusers:\n- name: {user}\n  user:\n    \
         client-certificate: {cert}\n    client-key: {key}\ncontexts:\n- name: polis\n  \
         context:\n    cluster: polis\n    user: {user}\ncurrent-context: polis\n"
    )
}

/// The bindings Polis keeps: each Polis role's group to its ClusterRole, and the
/// apiservers' kubelet client to kubelet access. Applied with kubectl (server-side).
pub fn rbac_bindings() -> String {
    [
        (crate::certs::GROUP_ADMINS, "cluster-admin"),
        (crate::certs::GROUP_OPERATORS, "edit"),
        (crate::certs::GROUP_READERS, "view"),
        (crate::certs::GROUP_APISERVERS, "system:kubelet-api-admin"),
    ]
    .iter()
    .map(|(group, role)| {
        format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  \
             name: \"{group}\"\n  labels:\n    polis.dev/managed: \"true\"\nroleRef:\n  \
             apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: \"{role}\"\n\
             subjects:\n- apiGroup: rbac.authorization.k8s.io\n  kind: Group\n  name: \"{group}\"\n"
        )
    })
    .collect::<Vec<_>>()
    .join("---\n")
}

/// A person's kubeconfig with its credentials inline (base64 PEM): one cluster per
/// server, the first current (`polisctl kubernetes credentials`). `tls_server_name`
/// overrides the name checked in the apiserver's certificate (a local proxy's address).
pub fn user_kubeconfig(
    servers: &[String],
    tls_server_name: Option<&str>,
    ca_pem: &str,
    user: &str,
    cert_pem: &str,
    key_pem: &str,
) -> String {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let mut out = String::from("apiVersion: v1\nkind: Config\nclusters:\n");
    for (i, server) in servers.iter().enumerate() {
        out.push_str(&format!(
            "- name: polis-{i}\n  cluster:\n    certificate-authority-data: {}\n    server: {server}\n",
            b64(ca_pem)
        ));
        if let Some(name) = tls_server_name {
            out.push_str(&format!("    tls-server-name: {name}\n"));
        }
    }
    out.push_str(&format!(
        "users:\n- name: \"{user}\"\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n",
        b64(cert_pem),
        b64(key_pem)
    ));
    for i in 0..servers.len() {
        out.push_str(&format!(
            "- name: polis-{i}\n  context:\n    cluster: polis-{i}\n    user: \"{user}\"\n"
        ));
    }
    out.push_str("current-context: polis-0\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(address: &str) -> Layout {
        Layout {
            dir: "/r/data/kubernetes".into(),
            address: address.parse().unwrap(),
            cluster_domain: "polis.internal".into(),
        }
    }

    #[test]
    fn the_apiserver_reaches_etcd_only_through_the_proxy_and_never_compacts() {
        let args = layout("127.0.0.2").apiserver_args();
        assert!(args.contains(&"--etcd-servers=unix:///r/data/kubernetes/etcd.sock".to_string()));
        assert!(args.contains(&"--etcd-compaction-interval=0".to_string()));
        assert!(args.contains(&"--endpoint-reconciler-type=none".to_string()));
        assert!(args.contains(&"--authorization-mode=Node,RBAC".to_string()));
        assert!(
            !layout("10.0.0.2")
                .apiserver_args()
                .iter()
                .any(|a| a.contains("reconciler"))
        );
    }

    #[test]
    fn kubeconfigs_name_this_nodes_apiserver_and_the_files() {
        let text = layout("127.0.0.2").kubeconfig("scheduler");
        assert!(text.contains("server: https://127.0.0.2:6443"), "{text}");
        assert!(
            text.contains("client-key: \"/r/data/kubernetes/scheduler.key\""),
            "{text}"
        );
    }

    #[test]
    fn the_apiserver_asks_polis_about_tokens_on_its_own_loopback() {
        let l = layout("127.0.0.2");
        let args = l.apiserver_args();
        assert!(args.contains(&"--authentication-token-webhook-cache-ttl=10s".to_string()));
        assert!(args.contains(&"--authentication-token-webhook-version=v1".to_string()));
        let text = l.token_webhook_kubeconfig();
        assert!(
            text.contains("server: https://127.0.0.2:6445/authenticate"),
            "{text}"
        );
        assert!(text.contains("tls-server-name: kubernetes"));
    }

    #[test]
    fn every_role_group_is_bound() {
        let text = rbac_bindings();
        for (group, role) in [
            ("polis:admins", "cluster-admin"),
            ("polis:operators", "edit"),
            ("polis:readers", "view"),
        ] {
            assert!(
                text.contains(&format!("name: \"{group}\""))
                    && text.contains(&format!("name: \"{role}\"")),
                "{text}"
            );
        }
        assert_eq!(text.matches("kind: ClusterRoleBinding").count(), 4);
    }

    #[test]
    fn a_user_kubeconfig_has_a_context_per_server() {
        let text = user_kubeconfig(
            &[
                "https://127.0.0.2:6443".into(),
                "https://127.0.0.3:6443".into(),
            ],
            Some("kubernetes"),
            "CA",
            "polis:owner",
            "CERT",
            "KEY",
        );
        assert_eq!(text.matches("tls-server-name: kubernetes").count(), 2);
        assert!(text.contains("current-context: polis-0"));
        assert!(text.contains("cluster: polis-1"));
    }
}
