//! What a worker's programs read (pure): containerd's configuration, the CNI network,
//! the kubelet's configuration and kubeconfig, their flags. Configured around what the
//! project's machines allow (`../shared/reference/kubernetes.md` §6): cgroup v1 with
//! the cgroupfs driver, no CAP_SYS_RESOURCE (OOM scores left alone), no swap, a disk
//! that may run low (eviction thresholds at zero).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

/// The sandbox (pause) image every pod starts with, imported from the node's images
/// (never pulled).
pub const SANDBOX_IMAGE: &str = "registry.k8s.io/pause:3.10.2";
/// The port of polis-node's forwarder to the apiservers on a worker (`apiproxy`).
pub const API_PROXY_PORT: u16 = 6444;

/// Where the kubelet reaches the apiservers: polis-node's forwarder (`apiproxy`, which
/// joins the first controller that accepts) on the worker's loopback — on its own
/// address when that is a loopback one (nodes sharing a machine, in tests), so that
/// two such workers do not share one port.
pub fn api_proxy(address: IpAddr) -> SocketAddr {
    if address.is_loopback() {
        SocketAddr::new(address, API_PROXY_PORT)
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), API_PROXY_PORT)
    }
}
/// The kubelet's port (apiserver → kubelet: logs, exec), on the node's address.
pub const KUBELET_PORT: u16 = 10250;

/// The files of one worker, under its folder.
#[derive(Debug, Clone)]
pub struct WorkerLayout {
    pub dir: PathBuf,
    pub address: IpAddr,
    pub node_id: String,
    /// containerd, containerd-shim-runc-v2, runc, ctr.
    pub runtime: PathBuf,
    /// The CNI plugins (Debian's containernetworking-plugins).
    pub cni_bin: PathBuf,
}

fn quoted(path: &Path) -> String {
    serde_json::to_string(&path.display().to_string()).expect("a string serializes")
}

impl WorkerLayout {
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// runc's state of this worker's containers (`runc --root`).
    pub fn runc_root(&self) -> PathBuf {
        self.path("containerd/runc")
    }

    pub fn containerd_socket(&self) -> PathBuf {
        self.path("containerd/containerd.sock")
    }

    /// containerd 2.x's configuration (version 3): its own root, state and socket under
    /// the worker's folder; runc by path (no PATH lookup), cgroupfs, OOM scores
    /// restricted; the pinned sandbox image; CNI from `cni_bin` and the worker's folder.
    pub fn containerd_config(&self) -> String {
        let p = |name: &str| quoted(&self.path(name));
        format!(
            "version = 3\nroot = {root}\nstate = {state}\nimports = []\n\n[grpc]\n  address = {sock}\n\n\
             [ttrpc]\n  address = {ttrpc}\n\n[plugins]\n  [plugins.'io.containerd.cri.v1.images']\n    \
             snapshotter = 'overlayfs'\n    [plugins.'io.containerd.cri.v1.images'.pinned_images]\n      \
             sandbox = '{SANDBOX_IMAGE}'\n  [plugins.'io.containerd.cri.v1.runtime']\n    \
             restrict_oom_score_adj = true\n    [plugins.'io.containerd.cri.v1.runtime'.containerd]\n      \
             default_runtime_name = 'runc'\n      \
             [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n        \
             runtime_type = 'io.containerd.runc.v2'\n        runtime_path = {shim}\n        \
             [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n          \
             BinaryName = {runc}\n          Root = {runc_root}\n          SystemdCgroup = false\n    \
             [plugins.'io.containerd.cri.v1.runtime'.cni]\n      bin_dirs = [{cni_bin}]\n      \
             conf_dir = {cni_conf}\n",
            root = p("containerd/root"),
            state = p("containerd/state"),
            sock = quoted(&self.containerd_socket()),
            ttrpc = p("containerd/containerd.sock.ttrpc"),
            shim = quoted(&self.runtime.join("containerd-shim-runc-v2")),
            runc = quoted(&self.runtime.join("runc")),
            runc_root = p("containerd/runc"),
            cni_bin = quoted(&self.cni_bin),
            cni_conf = p("cni"),
        )
    }

    pub fn containerd_args(&self) -> Vec<String> {
        vec![format!(
            "--config={}",
            self.path("containerd.toml").display()
        )]
    }

    /// The kubelet's configuration: x509 clients of the Kubernetes CA and webhook
    /// authorization (the apiserver decides), its serving certificate from the curator,
    /// served on the node's address only; cgroupfs on cgroup v1; no OOM score changes;
    /// no eviction thresholds (a small disk would evict everything).
    pub fn kubelet_config(&self) -> String {
        let p = |name: &str| quoted(&self.path(name));
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             address: {address}\nport: {KUBELET_PORT}\nhealthzBindAddress: {address}\n\
             readOnlyPort: 0\nauthentication:\n  anonymous: {{enabled: false}}\n  \
             webhook: {{enabled: true}}\n  x509: {{clientCAFile: {ca}}}\n\
             authorization: {{mode: Webhook}}\ntlsCertFile: {cert}\ntlsPrivateKeyFile: {key}\n\
             cgroupDriver: cgroupfs\nfailCgroupV1: false\nfailSwapOn: false\noomScoreAdj: 0\n\
             containerRuntimeEndpoint: unix://{sock}\nevictionHard: {{memory.available: \"0%\", \
             nodefs.available: \"0%\", nodefs.inodesFree: \"0%\", imagefs.available: \"0%\"}}\n\
             imageGCHighThresholdPercent: 100\nresolvConf: /etc/resolv.conf\n",
            address = self.address,
            ca = p("ca.pem"),
            cert = p("kubelet.pem"),
            key = p("kubelet.key"),
            sock = self.containerd_socket().display(),
        )
    }

    /// The kubelet's kubeconfig: through the forwarder, checking the apiserver's
    /// certificate against the Kubernetes CA under the name `kubernetes` (every
    /// apiserver's serving certificate names it; the forwarder's address is no name of
    /// theirs); the kubelet's token (`kubelet_token`) as its credential.
    pub fn kubelet_kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: polis\n  cluster:\n    \
             certificate-authority: {ca}\n    server: https://{proxy}\n    \
             tls-server-name: kubernetes\nusers:\n- name: kubelet\n  user:\n    \
             tokenFile: {token}\ncontexts:\n- name: polis\n  \
             context:\n    cluster: polis\n    user: kubelet\ncurrent-context: polis\n",
            proxy = api_proxy(self.address),
            ca = quoted(&self.path("ca.pem")),
            token = quoted(&self.path("kubelet.token")),
        )
    }

    /// The kubelet's flags: named after the Polis node, at the node's address.
    pub fn kubelet_args(&self) -> Vec<String> {
        vec![
            format!("--config={}", self.path("kubelet.yaml").display()),
            format!("--kubeconfig={}", self.path("kubelet.kubeconfig").display()),
            format!("--hostname-override={}", self.node_id),
            format!("--node-ip={}", self.address),
            format!("--root-dir={}", self.path("kubelet").display()),
            format!("--cert-dir={}", self.path("kubelet/pki").display()),
        ]
    }
}

/// The CNI network of a worker whose pods share the node's network only (this stage:
/// hostNetwork pods; a pod network across workers is not built yet): a loopback, which
/// is what the container runtime needs to call its network ready.
pub fn cni_loopback_conflist() -> String {
    "{\"cniVersion\": \"0.4.0\", \"name\": \"polis\", \"plugins\": [{\"type\": \"loopback\"}]}\n"
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> WorkerLayout {
        WorkerLayout {
            dir: "/r/data/kubernetes-worker".into(),
            address: "10.1.0.2".parse().unwrap(),
            node_id: "polis-w".into(),
            runtime: "/opt/runtime".into(),
            cni_bin: "/usr/lib/cni".into(),
        }
    }

    #[test]
    fn containerd_runs_runc_by_path_on_cgroupfs_with_the_pinned_sandbox() {
        let c = layout().containerd_config();
        assert!(c.contains("BinaryName = \"/opt/runtime/runc\""), "{c}");
        assert!(c.contains("runtime_path = \"/opt/runtime/containerd-shim-runc-v2\""));
        assert!(c.contains("SystemdCgroup = false"));
        assert!(c.contains("Root = \"/r/data/kubernetes-worker/containerd/runc\""));
        assert!(c.contains("restrict_oom_score_adj = true"));
        assert!(c.contains(&format!("sandbox = '{SANDBOX_IMAGE}'")));
        assert!(c.contains("address = \"/r/data/kubernetes-worker/containerd/containerd.sock\""));
        assert!(c.contains("bin_dirs = [\"/usr/lib/cni\"]"));
    }

    #[test]
    fn the_kubelet_is_the_polis_node_at_its_address_through_the_forwarder() {
        let l = layout();
        let config = l.kubelet_config();
        assert!(config.contains("address: 10.1.0.2\n"), "{config}");
        assert!(config.contains("failCgroupV1: false"));
        assert!(config.contains("anonymous: {enabled: false}"));
        assert!(config.contains("authorization: {mode: Webhook}"));
        let kubeconfig = l.kubelet_kubeconfig();
        assert!(
            kubeconfig.contains("server: https://127.0.0.1:6444"),
            "{kubeconfig}"
        );
        let on_loopback = WorkerLayout {
            address: "127.0.0.7".parse().unwrap(),
            ..l.clone()
        };
        assert!(
            on_loopback
                .kubelet_kubeconfig()
                .contains("server: https://127.0.0.7:6444")
        );
        assert!(kubeconfig.contains("tls-server-name: kubernetes"));
        assert!(kubeconfig.contains("tokenFile: \"/r/data/kubernetes-worker/kubelet.token\""));
        assert!(!kubeconfig.contains("client-certificate"));
        let args = l.kubelet_args();
        assert!(args.contains(&"--hostname-override=polis-w".to_string()));
        assert!(args.contains(&"--node-ip=10.1.0.2".to_string()));
    }
}
