//! Kubernetes on Polis, part 1, with real polis-node processes, real etcd and upstream's
//! own kube-apiserver, kube-controller-manager, kube-scheduler and kubectl (built by
//! `scripts/kubernetes-binaries`; `scripts/test` passes their folder in
//! POLIS_KUBERNETES_BINARIES). One cluster of three consensus members:
//! - KubernetesController is refused on a worker, and ConsensusMember cannot be removed
//!   from a controller;
//! - with the owner's polisctl-made kubeconfig, `/readyz` is ok, a namespace and a
//!   ConfigMap are created and read back; each controller's `node describe` names its
//!   three components running;
//! - a reader's kubeconfig lists but cannot create;
//! - the apiserver's etcd (the proxy's socket) shows none of Polis's keys, refuses a
//!   snapshot, the cluster PKI's keys (in the same etcd) are out of reach, and what the
//!   apiserver wrote lies under /polis-k8s in the real etcd;
//! - through `polisctl kubernetes proxy`, kubectl keeps working after a kill -9 of the
//!   node whose apiserver it was using;
//! - the role taken from a live controller stops its apiserver while the API stays;
//!   given back, it serves again;
//! - after the components' certificates renew (45 s lifetimes), kubectl still works.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use e2e::{Cluster, Node, TIMEOUT, endpoints, wait_until};

/// Components' certificate lifetime: renewed (at 2/3) while the test runs.
const LIFETIME_S: &str = "45";

fn binaries() -> Result<PathBuf> {
    let dir = std::env::var_os("POLIS_KUBERNETES_BINARIES").context(
        "POLIS_KUBERNETES_BINARIES is not set: run scripts/kubernetes-binaries and export \
         the folder it prints (scripts/test does)",
    )?;
    let dir = PathBuf::from(dir);
    ensure!(
        dir.join("kube-apiserver").is_file() && dir.join("kubectl").is_file(),
        "POLIS_KUBERNETES_BINARIES={} holds no kube-apiserver and kubectl",
        dir.display()
    );
    Ok(dir)
}

/// kubectl with `kubeconfig`: (success, stdout, stderr).
fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<(bool, String, String)> {
    e2e::kubectl(&binaries()?, kubeconfig, args)
}

/// kubectl until it succeeds (within `TIMEOUT`); its output.
fn kubectl_ok(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let (ok, out, err) = kubectl(kubeconfig, args)?;
        if ok {
            return Ok(out);
        }
        if Instant::now() > deadline {
            bail!("kubectl {args:?} kept failing: {err}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn apiserver_answers(address: IpAddr) -> bool {
    std::net::TcpStream::connect_timeout(
        &SocketAddr::new(address, 6443),
        Duration::from_millis(300),
    )
    .is_ok()
}

#[test]
fn kubernetes_controllers_serve_a_confined_highly_available_api() -> Result<()> {
    let binaries = binaries()?;
    let dir = tempfile::tempdir()?;
    let lifetime = format!("--kubernetes-certificate-lifetime-s={LIFETIME_S}");
    let node_args = [lifetime.as_str()];
    let mut cluster = Cluster::bootstrap_with(dir.path(), &[], &node_args)?;
    let params = cluster.register_params("nodes")?;
    let (mut m1, id1) = cluster.add_worker("m1", &params)?;
    let (mut m2, id2) = cluster.add_worker("m2", &params)?;
    let (_worker, worker_id) = cluster.add_worker("w", &params)?;
    for id in [&id1, &id2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    // The members in the test's hands (one is killed and started again).
    let placeholder = Node::new(&dir.path().join("unused"));
    let n0 = std::mem::replace(&mut cluster.first, placeholder);
    let id0 = n0.key_node_id()?;
    cluster.wait_members(&endpoints(&[&n0, &m1, &m2]), 3, 0)?;
    m1.wait_for_curator()?;
    m2.wait_for_curator()?;

    // The role needs consensus; consensus cannot go while the role is held.
    let (ok, _, err) = cluster.ctl(&["node", "add-role", &worker_id, "KubernetesController"])?;
    ensure!(
        !ok && err.contains("requires ConsensusMember"),
        "a worker took the role: {err}"
    );
    for id in [&id0, &id1, &id2] {
        cluster.ctl_retry(&["node", "add-role", id, "KubernetesController"])?;
    }
    let (ok, _, err) = cluster.ctl(&["node", "remove-role", &id1, "ConsensusMember"])?;
    ensure!(
        !ok && err.contains("remove KubernetesController first"),
        "ConsensusMember removed from a controller: {err}"
    );

    // The owner's kubeconfig: ready, a namespace and a ConfigMap written and read back.
    let owner = dir.path().join("owner.kubeconfig");
    let started = Instant::now();
    e2e::kubernetes_credentials(&cluster, &owner, None)?;
    let ready = kubectl_ok(&owner, &["get", "--raw", "/readyz"])?;
    ensure!(ready.trim() == "ok", "{ready}");
    println!("role added -> apiserver ready: {:?}", started.elapsed());
    // Each controller's status names its components, running (node describe).
    for id in [&id0, &id1, &id2] {
        wait_until(
            "node describe names the running components",
            TIMEOUT,
            || {
                cluster
                    .ctl(&["node", "describe", id, "-o", "json"])
                    .is_ok_and(|(ok, out, _)| {
                        ok && serde_json::from_str::<serde_json::Value>(&out).is_ok_and(|v| {
                            let programs = v["status"]["programs"].as_array().cloned();
                            [
                                "kube-apiserver",
                                "kube-controller-manager",
                                "kube-scheduler",
                            ]
                            .iter()
                            .all(|name| {
                                programs
                                    .iter()
                                    .flatten()
                                    .any(|p| p["name"] == *name && p["running"] == true)
                            })
                        })
                    })
            },
        )?;
    }
    kubectl_ok(&owner, &["create", "namespace", "demo"])?;
    kubectl_ok(
        &owner,
        &[
            "-n",
            "demo",
            "create",
            "configmap",
            "greeting",
            "--from-literal=hello=world",
        ],
    )?;
    let got = kubectl_ok(
        &owner,
        &[
            "-n",
            "demo",
            "get",
            "configmap",
            "greeting",
            "-o",
            "jsonpath={.data.hello}",
        ],
    )?;
    ensure!(got == "world", "{got}");

    // A reader lists but cannot create.
    let reader = dir.path().join("rita");
    let reader_pub = dir.path().join("rita.pub");
    let rctl = |args: &[&str]| -> Result<(bool, String, String)> {
        let mut all = vec!["--config", reader.to_str().context("utf-8")?];
        all.extend_from_slice(args);
        let (status, out, err) = e2e::polisctl(&all)?;
        Ok((status.success(), out, err))
    };
    let (ok, _, err) = rctl(&["key", "--out", reader_pub.to_str().context("utf-8")?])?;
    ensure!(ok, "{err}");
    cluster.ctl_retry(&[
        "cluster",
        "operator",
        "add",
        "rita",
        "--role",
        "reader",
        "--key-file",
        reader_pub.to_str().context("utf-8")?,
    ])?;
    let endpoint = n0.address.to_string();
    let (ok, _, err) = rctl(&["--endpoints", &endpoint, "takeownership", "--accept-ca"])?;
    ensure!(ok, "{err}");
    let reader_config = dir.path().join("rita.kubeconfig");
    let (ok, _, err) = rctl(&[
        "kubernetes",
        "credentials",
        "--out",
        reader_config.to_str().context("utf-8")?,
    ])?;
    ensure!(ok, "{err}");
    let listed = kubectl_ok(
        &reader_config,
        &["-n", "demo", "get", "configmaps", "-o", "name"],
    )?;
    ensure!(listed.contains("configmap/greeting"), "{listed}");
    let (ok, _, err) = kubectl(
        &reader_config,
        &["-n", "demo", "create", "configmap", "nope"],
    )?;
    ensure!(
        !ok && err.contains("forbidden"),
        "a reader created a ConfigMap: {err}"
    );

    // The apiserver's etcd: only its own keys, no snapshot; Polis's keys unreachable.
    let socket = n0.root.join("data/kubernetes/etcd.sock");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (keys, cluster_keys, snapshot) = runtime.block_on(async {
        let mut client = consensus::connect_unix(&socket).await?;
        let all = etcd_client::GetOptions::new()
            .with_prefix()
            .with_keys_only();
        let keys: Vec<String> = client
            .get("", Some(all.clone()))
            .await?
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect();
        // Where the cluster CA's key really is: out of reach, by name or by range.
        let cluster_keys = client
            .get("namespaced:curator/cluster-pki/", Some(all))
            .await?
            .kvs()
            .len();
        let snapshot = match client.snapshot().await {
            Ok(mut stream) => stream
                .message()
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        Ok::<_, anyhow::Error>((keys, cluster_keys, snapshot))
    })?;
    ensure!(
        keys.iter()
            .any(|k| k.starts_with("/registry/namespaces/demo")),
        "the apiserver's keys are listed: {keys:?}"
    );
    ensure!(
        keys.iter().all(|k| k.starts_with("/registry")),
        "a key outside the apiserver's space: {keys:?}"
    );
    ensure!(
        cluster_keys == 0,
        "the cluster PKI through the proxy: {cluster_keys} keys"
    );
    let refusal = snapshot.err().context("a snapshot through the proxy")?;
    ensure!(refusal.contains("not available"), "{refusal}");
    let raw = n0.etcdctl(&["get", "/polis-k8s/registry/namespaces/demo", "--keys-only"])?;
    ensure!(raw.contains("/polis-k8s/registry/namespaces/demo"), "{raw}");
    let raw_pki = n0.etcdctl(&[
        "get",
        "namespaced:curator/cluster-pki/",
        "--prefix",
        "--keys-only",
        "--limit=1",
    ])?;
    ensure!(
        !raw_pki.trim().is_empty(),
        "the cluster PKI is in the same etcd: {raw_pki}"
    );

    // Through the proxy, kubectl survives the loss of the apiserver it was using.
    let (_proxy, via) = e2e::kubernetes_proxy(&cluster, dir.path())?;
    kubectl_ok(&via, &["-n", "demo", "get", "configmap", "greeting"])?;
    // The proxy prefers the first apiserver by address: that node is killed.
    let mut members = [n0, m1, m2];
    members.sort_by_key(|n| n.address);
    let used = members[0].address;
    members[0].proc().signal(libc::SIGKILL);
    let killed = Instant::now();
    wait_until("kubectl works again after a kill -9", TIMEOUT, || {
        kubectl(&via, &["-n", "demo", "get", "configmap", "greeting"]).is_ok_and(|(ok, ..)| ok)
    })?;
    println!(
        "controller {used} lost -> API served again: {:?}",
        killed.elapsed()
    );
    members[0].proc().wait_exit(TIMEOUT)?;
    members[0].start(&[])?;

    // The role taken from a live controller: its apiserver stops, the API stays.
    let live_address = members[1].address;
    let live_id = members[1].key_node_id()?;
    cluster.ctl_retry(&["node", "remove-role", &live_id, "KubernetesController"])?;
    wait_until("the apiserver stops with the role", TIMEOUT, || {
        !apiserver_answers(live_address)
    })?;
    kubectl_ok(&via, &["-n", "demo", "get", "configmap", "greeting"])?;
    cluster.ctl_retry(&["node", "add-role", &live_id, "KubernetesController"])?;
    let served = wait_until("the apiserver serves again with the role", TIMEOUT, || {
        apiserver_answers(live_address)
    });
    if let Err(e) = served {
        let output = members[1].proc().output();
        let lines: Vec<&str> = output
            .lines()
            .filter(|l| l.contains("kubernetes") || l.contains("roles"))
            .filter(|l| !l.contains("kubernetes::component"))
            .collect();
        bail!(
            "{e}: {}",
            lines[lines.len().saturating_sub(40)..].join("\n")
        );
    }

    // After the components' certificates renewed, kubectl still works.
    members[2]
        .proc()
        .wait_for_line(TIMEOUT, |l| l.contains("Kubernetes certificates renewed"))
        .context("the components' certificates renew")?;
    let renewed_owner = dir.path().join("owner2.kubeconfig");
    e2e::kubernetes_credentials(&cluster, &renewed_owner, None)?;
    kubectl_ok(&via, &["-n", "demo", "get", "configmap", "greeting"])?;
    drop(binaries);
    Ok(())
}
