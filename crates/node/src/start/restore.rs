//! `polis-node restore --root NEWROOT --address ADDR --backup FILE`: a new root becomes
//! the only consensus member and curator of the cluster a Polis backup was taken from
//! (same cluster CA, owner, node records and labels), then the node starts as usual (the
//! Plan is an ordinary join).
//!
//! ```text
//!   root empty or absent ─▶ backup verified (structure + SHA-256) ─▶ address on this
//!   machine ─▶ etcd binary, free ports ─▶ root lock
//!   ─▶ node key ─▶ `etcdctl snapshot restore` into data/etcd/data (name = node ID,
//!      token polis-<node ID>, this node's peer URL: the IDs a bootstrap would get)
//!   ─▶ etcd started once (throwaway peer files)
//!   ─▶ the backup's consensus members asked (peer ports): a live cluster refused
//!      (unless --force; a --drill goes on, at an address of its own, in a drill epoch)
//!   ─▶ the new epoch recorded ─▶ cluster CA, etcd peer CA loaded
//!   ─▶ both CRLs signed again, numbered past any CRL issued before (`reissue_crls`)
//!   ─▶ peer + node certificates issued ─▶ this node's record created (UP,
//!      ConsensusMember) ─▶ the backup's leases revoked ─▶ etcd stopped
//!   ─▶ peer files, node files, roles.pb, directory.pb, quota.pb ─▶ sealed configuration
//!      (last) ─▶ Plan::Join
//! ```
//! Other nodes' records are kept, except that former members lose their recorded etcd
//! member ID (none of them belongs to the restored etcd cluster): workers come back by
//! themselves when the address is a former member's; a former member's etcd belongs to
//! another etcd cluster and rejoins as a learner (see `rejoin`), recording its new ID.
//!
//! The cluster CA found in the snapshot must be one the backup's header names (the
//! signing one, or during a rotation one of those trusted).
//! Any failure after the root was touched removes what this run created (the root itself
//! when it was absent), so a refused restore leaves nothing behind. A start path: may not
//! start runnables or touch shared values.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, Result, anyhow, bail};
use consensus::{EtcdConfig, InitialClusterState, RaftTiming, Readiness, Status};
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use identity::NodeKey;
use pki::{CA_LIFETIME, Ca};
use prost::Message as _;
use proto::config::SealedConfiguration;
use proto::state::{ConsensusMemberRole, Node, NodeRoles, NodeState};

use crate::data::datadev::{self, DataDevice};
use crate::disk::files::{peer_tls_files, record_quota, save_member_files, write_peer_files};
use crate::disk::storage::{Root, RootLock, write_atomic, write_proto};
use crate::start::preflight::{self, Flags, Plan};

/// What `restore` needs of its flags.
#[derive(Debug, Clone)]
pub struct RestoreFlags {
    pub address: IpAddr,
    pub backup: PathBuf,
    pub etcd_binary: PathBuf,
    pub raft_timing: RaftTiming,
    /// `--force`: restore although a majority of the backup's members answer.
    pub force: bool,
    /// `--drill`: a rehearsal beside the live cluster (see [`proto::epoch::DRILL`]).
    pub drill: bool,
}

/// Whether `root` may receive a restore: absent, or an empty directory. Returns whether
/// it exists.
fn check_root_empty(root: &Path) -> Result<bool> {
    if !root.exists() {
        return Ok(false);
    }
    if !root.is_dir() {
        bail!(
            "node root {} is not a directory: restore needs an empty or absent root",
            root.display()
        );
    }
    let mut entries =
        std::fs::read_dir(root).with_context(|| format!("reading node root {}", root.display()))?;
    if entries.next().is_some() {
        bail!(
            "node root {} is not empty: restore needs an empty or absent root (it makes a new \
             member; a node that already belongs to a cluster starts without `restore`)",
            root.display()
        );
    }
    Ok(true)
}

/// Every refusal, then the restore itself; the lock, a join plan and, with
/// `--data-device`, the encrypted data volume mounted on `data/`.
pub async fn restore(
    root: &Root,
    flags: &RestoreFlags,
    data_device: Option<&DataDevice>,
) -> Result<(RootLock, Plan, Option<datafs::Volume>)> {
    let existed = check_root_empty(&root.root)?;
    let backup = backup::inspect_file(&flags.backup).map_err(|e| anyhow!("backup {e}"))?;
    preflight::check_address(flags.address)?;
    preflight::check_etcd_binary(&flags.etcd_binary)?;
    let etcdctl = etcdctl_binary(&flags.etcd_binary);
    preflight::check_etcd_binary(&etcdctl).context("etcdctl is needed to restore a snapshot")?;
    preflight::check_control_plane_ports(flags.address)?;
    tracing::warn!(
        backup = %flags.backup.display(),
        from_node = backup.header.node_id,
        revision = backup.header.revision,
        "restoring a cluster from a backup"
    );
    let lock = preflight::lock_root(root)?;
    let mut volume = None;
    let restored = async {
        let data = match data_device {
            Some(dev) => {
                let (mounted, join, half) = datadev::open_restoring(
                    root,
                    dev,
                    &backup.header.ca_fingerprint,
                    flags.address,
                )
                .await?;
                volume = Some(mounted);
                Some((join, half))
            }
            None => None,
        };
        restore_into(root, flags, &backup, &etcdctl, data).await
    }
    .await;
    match restored {
        Ok(plan) => Ok((lock, plan, volume)),
        Err(e) => {
            if let Some(volume) = volume {
                datadev::close(volume).await;
            }
            if let Err(c) = clean_up(&root.root, existed) {
                tracing::error!(
                    "cleaning up {} after a failed restore: {c:#}",
                    root.root.display()
                );
            }
            Err(e)
        }
    }
}

/// etcdctl, next to the etcd binary (Debian installs both in /usr/bin).
pub fn etcdctl_binary(etcd: &Path) -> PathBuf {
    etcd.with_file_name("etcdctl")
}

/// Removes what a failed restore created: the root, or its contents when it existed.
fn clean_up(root: &Path, existed: bool) -> Result<()> {
    if !existed {
        return std::fs::remove_dir_all(root)
            .with_context(|| format!("removing {}", root.display()));
    }
    for entry in std::fs::read_dir(root)? {
        let path = entry?.path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        }
        .with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(())
}

async fn restore_into(
    root: &Root,
    flags: &RestoreFlags,
    backup: &backup::Backup,
    etcdctl: &Path,
    data: Option<(Vec<u8>, Vec<u8>)>,
) -> Result<Plan> {
    root.prepare()?;
    let key = NodeKey::generate().context("generating the node key")?;
    write_atomic(&root.node_key(), key.pkcs8_der()).context("saving the node key")?;
    let node_id = key.node_id();
    let (cluster_id, member_id, (cluster_ca, quota)) =
        serve_backup(root, flags, backup, etcdctl, &key, async |running| {
            let state = write_cluster_state(root, flags, backup, &key, running, data).await?;
            Ok((running.cluster_id, running.member_id, state))
        })
        .await?;

    record_quota(root, quota)?;
    save_member_files(root, flags.address)?;
    let sealed = SealedConfiguration {
        node_id: node_id.clone(),
        cluster_ca_certificate: cluster_ca,
        address: flags.address.to_string(),
        etcd_cluster_id: cluster_id,
        etcd_member_id: member_id,
    };
    write_proto(&root.sealed_configuration(), &sealed)
        .context("writing the sealed configuration")?;
    tracing::warn!(
        node_id,
        cluster_id = format!("{cluster_id:x}"),
        "restored: this node is the only consensus member of the restored cluster"
    );
    let start = Flags {
        address: flags.address,
        params: None,
        etcd_binary: flags.etcd_binary.clone(),
    };
    let join = preflight::load_join(&start, root)?;
    Ok(Plan::Join(Arc::new(join)))
}

/// A backup's snapshot restored into `root`'s etcd data directory and served once, by
/// an etcd named for `key` on `flags.address` (throwaway peer files: the peer CA's key is
/// in the snapshot, readable only once etcd runs; a one-member cluster has no peer to
/// present them to), while `use_etcd` runs; etcd is stopped after it, whatever it
/// returned. Restore writes the new member's state this way; recover reads a member's
/// record (its data key's cluster half) from the owner's backup this way, in a scratch
/// root.
pub async fn serve_backup<T>(
    root: &Root,
    flags: &RestoreFlags,
    backup: &backup::Backup,
    etcdctl: &Path,
    key: &NodeKey,
    use_etcd: impl AsyncFnOnce(&consensus::Running) -> Result<T>,
) -> Result<T> {
    let node_id = key.node_id();
    restore_snapshot(root, flags, backup, etcdctl, &node_id).await?;
    let throwaway = Ca::generate("Polis restore (throwaway)", CA_LIFETIME)?;
    let lifetime = curator::templates::node_certificate_lifetime(None);
    let cert = throwaway.issue(
        &curator::templates::peer_certificate_template(&node_id, flags.address, lifetime),
        &key.public_key(),
    )?;
    let crl = throwaway.crl(&[], 1)?;
    write_peer_files(
        root,
        key,
        std::slice::from_ref(&throwaway.cert_der),
        &cert.der,
        &crl,
    )
    .context("writing temporary etcd peer files")?;

    let config = etcd_config(root, flags, &node_id);
    let status = event::Value::<Status>::new();
    let etcd_status = status.clone();
    let supervisor = supervisor::Supervisor::start(supervisor::Config::default(), move |ctx| {
        let (config, status) = (config.clone(), etcd_status.clone());
        async move {
            consensus::run(&ctx, &config, &status).await?;
            Ok(())
        }
    });
    let served = async {
        let running = match status
            .watch()
            .get_matching(|s| matches!(s, Status::Running(_)))
            .await?
        {
            Status::Running(r) => r,
            Status::Stopped => unreachable!("filtered for Running"),
        };
        use_etcd(&running).await
    };
    let outcome = tokio::time::timeout(std::time::Duration::from_secs(60), served).await;
    supervisor.shutdown().await;
    outcome.map_err(|_| anyhow!("the restored etcd did not serve within 60 s"))?
}

/// The cluster CA in a restored snapshot, which must be one the backup's header names
/// (the signing CA, or one trusted during a rotation).
pub async fn backup_cluster_ca(
    curator_ns: &consensus::Namespaced,
    flags: &RestoreFlags,
    backup: &backup::Backup,
) -> Result<Ca> {
    let cluster_ca = curator::cluster_pki(curator_ns)
        .load_ca()
        .await
        .context("loading the cluster CA")?
        .ok_or_else(|| {
            anyhow!(
                "backup {}: the snapshot holds no cluster CA",
                flags.backup.display()
            )
        })?;
    let fingerprint = rpc::fingerprint(&cluster_ca.cert_der);
    // The header names the signing CA as the serving curator followed it, and every CA
    // trusted then: a snapshot taken as a rotation promoted its new CA may hold either.
    let named = fingerprint == backup.header.ca_fingerprint
        || backup.header.trusted_ca_fingerprints.contains(&fingerprint);
    if !named {
        bail!(
            "backup {}: the snapshot's cluster CA ({fingerprint}) is none its header names \
             (signing {}, trusted {:?})",
            flags.backup.display(),
            backup.header.ca_fingerprint,
            backup.header.trusted_ca_fingerprints
        );
    }
    Ok(cluster_ca)
}

/// The snapshot, verified again while it is copied out, restored into the etcd data
/// directory as this node's one-member cluster.
async fn restore_snapshot(
    root: &Root,
    flags: &RestoreFlags,
    backup: &backup::Backup,
    etcdctl: &Path,
    node_id: &str,
) -> Result<()> {
    let snapshot = root.data().join("restore-snapshot.db");
    {
        let mut input = std::io::BufReader::new(
            std::fs::File::open(&flags.backup)
                .with_context(|| format!("opening backup {}", flags.backup.display()))?,
        );
        let mut out =
            privatefs::AtomicFile::create(&snapshot).map_err(|e| anyhow!("{e}: {}", e.source))?;
        backup::copy_snapshot(&mut input, backup, &mut out)
            .map_err(|e| anyhow!("backup {}: {e}", flags.backup.display()))?;
        out.commit()
            .map_err(|e| anyhow!("writing {}: {e}", snapshot.display()))?;
    }
    let peer_url = consensus::config::peer_url(flags.address, consensus::config::PEER_PORT);
    let output = tokio::process::Command::new(etcdctl)
        .env("ETCDCTL_API", "3")
        .arg("snapshot")
        .arg("restore")
        .arg(&snapshot)
        .arg("--name")
        .arg(node_id)
        .arg("--initial-cluster")
        .arg(format!("{node_id}={peer_url}"))
        .arg("--initial-cluster-token")
        .arg(format!("polis-{node_id}"))
        .arg("--initial-advertise-peer-urls")
        .arg(&peer_url)
        .arg("--data-dir")
        .arg(root.etcd_data())
        .output()
        .await
        .with_context(|| format!("running {}", etcdctl.display()))?;
    let _ = std::fs::remove_file(&snapshot);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().last().unwrap_or("").trim();
        bail!(
            "backup {}: etcdctl snapshot restore failed ({}): {last}",
            flags.backup.display(),
            output.status
        );
    }
    Ok(())
}

fn etcd_config(root: &Root, flags: &RestoreFlags, node_id: &str) -> EtcdConfig {
    let peer_url = consensus::config::peer_url(flags.address, consensus::config::PEER_PORT);
    EtcdConfig {
        binary: flags.etcd_binary.clone(),
        name: node_id.to_string(),
        data_dir: root.etcd_data(),
        run_dir: root.consensus_run_dir(),
        peer_address: flags.address,
        peer_port: consensus::config::PEER_PORT,
        peer_tls: peer_tls_files(root),
        initial_cluster: vec![(node_id.to_string(), peer_url)],
        initial_cluster_state: InitialClusterState::Existing,
        cluster_token: format!("polis-{node_id}"),
        timing: flags.raft_timing,
        readiness: Readiness::Linearizable,
        quota_backend_bytes: proto::quota::DEFAULT_QUOTA_BYTES,
        force_new_cluster: false,
    }
}

/// In the restored etcd: this node's certificates and record; on disk: its peer and node
/// files. Returns the cluster CA certificate and the quota the member runs with.
async fn write_cluster_state(
    root: &Root,
    flags: &RestoreFlags,
    backup: &backup::Backup,
    key: &NodeKey,
    running: &consensus::Running,
    data: Option<(Vec<u8>, Vec<u8>)>,
) -> Result<(Vec<u8>, u64)> {
    let node_id = key.node_id();
    let curator_ns = running.namespaced(curator::layout::NAMESPACE);
    check_former_members(&curator_ns, flags).await?;
    start_epoch(root, &curator_ns, &node_id, flags.drill).await?;
    let cluster_pki = curator::cluster_pki(&curator_ns);
    let etcd_pki = curator::layout::etcd_pki(running.client.clone());
    let what = |w: &str| format!("backup {}: {w}", flags.backup.display());
    let cluster_ca = backup_cluster_ca(&curator_ns, flags, backup).await?;
    let peer_ca = etcd_pki
        .load_ca()
        .await
        .context("loading the etcd peer CA")?
        .ok_or_else(|| anyhow!(what("the snapshot holds no etcd peer CA")))?;
    let configuration = curator::records::cluster_configuration(&curator_ns)
        .await
        .context("loading the cluster configuration")?
        .ok_or_else(|| anyhow!(what("the snapshot holds no cluster configuration")))?;
    let quota = proto::quota::effective_quota(configuration.etcd_quota_bytes)
        .context("the restored cluster's etcd quota")?;
    reissue_crls(&running.client).await?;
    let lifetime = curator::templates::node_certificate_lifetime(Some(&configuration));
    let peer_certificate = etcd_pki
        .ensure_certificate(&curator::layout::peer_certificate_prefix(&node_id), || {
            peer_ca.issue(
                &curator::templates::peer_certificate_template(&node_id, flags.address, lifetime),
                &key.public_key(),
            )
        })
        .await
        .context("issuing the etcd peer certificate")?;
    let crl = etcd_pki.crl().await.context("loading the etcd peer CRL")?;
    write_peer_files(
        root,
        key,
        std::slice::from_ref(&peer_ca.cert_der),
        &peer_certificate,
        &crl,
    )
    .context("writing etcd peer TLS files")?;
    crate::start::bootstrap::save_node_certificate(
        root,
        &cluster_pki,
        &cluster_ca,
        key,
        flags.address,
        lifetime,
    )
    .await?;
    let (data_join_key, data_cluster_half) = data.unwrap_or_default();
    let node = Node {
        id: node_id.clone(),
        data_join_key,
        data_cluster_half,
        public_key: key.public_key().to_vec(),
        state: NodeState::Up as i32,
        roles: Some(NodeRoles {
            consensus_member: Some(ConsensusMemberRole {
                member_id: running.member_id,
                removal_pending: false,
            }),
            ..Default::default()
        }),
        address: flags.address.to_string(),
        ..Default::default()
    };
    let record = curator_ns.key(&curator::layout::node_key(&node_id));
    let txn = Txn::new()
        .when([Compare::create_revision(
            record.clone(),
            CompareOp::Equal,
            0,
        )])
        .and_then([TxnOp::put(record, node.encode_to_vec(), None)]);
    let response = running
        .client
        .clone()
        .txn(txn)
        .await
        .context("creating this node's record")?;
    if !response.succeeded() {
        bail!("the restored cluster already holds a record of node {node_id}");
    }
    mark_former_members(&curator_ns, &node_id).await?;
    // Every lease is one of the backup's curators: without them, the restored curator
    // would name the backup's leader (clients would follow it) until its lease ran out.
    revoke_old_leases(running.client.clone()).await;
    Ok((cluster_ca.cert_der, quota))
}

/// The restored cluster's new epoch (see `proto::epoch`), recorded in its etcd before
/// anything else is written there (so the backup's history ends at the revision it
/// names) and beside its data: former members of the backup's cluster that hold more
/// than the backup never serve again, nor drop what the backup lacks.
async fn start_epoch(
    root: &Root,
    curator_ns: &consensus::Namespaced,
    node_id: &str,
    drill: bool,
) -> Result<proto::config::ClusterEpoch> {
    let chain = curator::epochs::chain(curator_ns, false)
        .await
        .context("reading the backup's cluster epochs")?;
    let revision = curator_ns
        .client()
        .get(curator_ns.key(curator::layout::EPOCHS_PREFIX), None)
        .await
        .context("reading the restored revision")?
        .header()
        .map(|h| h.revision())
        .unwrap_or_default();
    let parent = proto::epoch::latest(&chain);
    let kind = if drill {
        proto::epoch::DRILL
    } else {
        "restore"
    };
    let epoch = crate::member::epochs::successor(&parent, node_id, kind, revision);
    let recorded = curator::epochs::record(curator_ns, &epoch)
        .await
        .context("recording the restored cluster's epoch")?;
    crate::member::epochs::keep(root, &recorded)?;
    Ok(recorded)
}

/// The backup's consensus members: (node ID, address) of every record holding
/// ConsensusMember that is not decommissioned.
fn former_members(nodes: &[Node]) -> Vec<(String, IpAddr)> {
    nodes
        .iter()
        .filter(|n| {
            n.roles
                .as_ref()
                .is_some_and(|r| r.consensus_member.is_some())
                && !matches!(
                    curator::records::node_state(n),
                    NodeState::Decommissioned | NodeState::Decommissioning
                )
        })
        .filter_map(|n| Some((n.id.clone(), n.address.parse().ok()?)))
        .collect()
}

/// Why a restore at `address` must not go on (pure): `members` are the backup's
/// consensus members, `answering` those of them whose etcd peer port accepted a
/// connection. A cluster that may still have its quorum is refused (a member down for a
/// moment would come back to a newer epoch and hold back: a full outage) unless
/// `force`; a drill goes on beside a live cluster but never at a member's address (it
/// would take that member's place in the others' directories).
pub fn refusal(
    address: IpAddr,
    members: &[(String, IpAddr)],
    answering: &[IpAddr],
    force: bool,
    drill: bool,
) -> Option<String> {
    if drill {
        return members.iter().find(|(_, ip)| *ip == address).map(|(id, _)| {
            format!(
                "refusing a drill at {address}: it is the address of consensus member {id} of                  the backup's cluster; a drill runs at an address none of its members had"
            )
        });
    }
    let others: Vec<_> = members.iter().filter(|(_, ip)| *ip != address).collect();
    let live: Vec<String> = others
        .iter()
        .filter(|(_, ip)| answering.contains(ip))
        .map(|(id, ip)| format!("{id} ({ip})"))
        .collect();
    if force || !crate::member::epochs::majority_answering(live.len(), others.len()) {
        return None;
    }
    Some(format!(
        "refusing to restore: {} of the backup's {} other consensus members still answer on \
         their etcd peer ports ({}), so the cluster may still have its quorum and a restore \
         would make a second cluster. Stop them, or pass --force if they are lost for good; \
         to rehearse a restore beside the live cluster, pass --drill (at an address of its own)",
        live.len(),
        others.len(),
        live.join(", ")
    ))
}

/// Asks the backup's consensus members (their etcd peer ports, as `recover` asks the
/// other members) whether the cluster still lives; see [`refusal`].
async fn check_former_members(
    curator_ns: &consensus::Namespaced,
    flags: &RestoreFlags,
) -> Result<()> {
    let nodes = curator::records::list_nodes(curator_ns)
        .await
        .context("listing the backup's node records")?;
    let members = former_members(&nodes);
    let peers: Vec<std::net::SocketAddr> = members
        .iter()
        .filter(|(_, ip)| *ip != flags.address)
        .map(|(_, ip)| std::net::SocketAddr::new(*ip, consensus::config::PEER_PORT))
        .collect();
    let answering: Vec<IpAddr> = crate::member::epochs::answering_peers(&peers)
        .await
        .into_iter()
        .map(|a| a.ip())
        .collect();
    if let Some(why) = refusal(
        flags.address,
        &members,
        &answering,
        flags.force,
        flags.drill,
    ) {
        bail!("backup {}: {why}", flags.backup.display());
    }
    if flags.force && !answering.is_empty() {
        tracing::warn!(
            answering = answering.len(),
            "--force: restoring although members of the backup's cluster answer"
        );
    }
    if flags.drill {
        tracing::warn!(
            answering = answering.len(),
            "a drill: the restored cluster's epoch is a drill's; clients that have seen the \
             live cluster refuse its answers"
        );
    }
    Ok(())
}

/// Revokes every lease of the recovered etcd (see `record_claim`; a restore's too); a
/// failure only costs the campaign its usual wait.
pub(crate) async fn revoke_old_leases(mut client: etcd_client::Client) {
    let leases = match client.leases().await {
        Ok(answer) => answer.leases().iter().map(|l| l.id()).collect::<Vec<_>>(),
        Err(e) => {
            tracing::warn!("listing the leases of before the recovery: {e}");
            return;
        }
    };
    for id in &leases {
        if let Err(e) = client.lease_revoke(*id).await {
            tracing::warn!(
                lease = format!("{id:x}"),
                "revoking a lease of before the recovery: {e}"
            );
        }
    }
    tracing::info!(
        leases = leases.len(),
        "revoked the election leases of before the recovery"
    );
}

/// Signs both CAs' CRLs again with numbers past every CRL issued before now
/// (`pki::CaStore::reissue_crl`), for a cluster that continues from an older copy of
/// its etcd data: a backup (restore), or a member that may have lagged (recover).
/// Nodes and polisctl keep the newest CRL they saw by number; without this they would
/// ignore the copy's CRLs, and so every revocation, until the numbers caught up. The
/// etcd peer CRL's number is compared by nobody today (its file is rewritten whole),
/// but is kept growing the same way.
pub async fn reissue_crls(client: &etcd_client::Client) -> Result<()> {
    let curator_ns = consensus::Namespaced::new(client.clone(), curator::layout::NAMESPACE);
    let stores = [
        ("cluster", curator::cluster_pki(&curator_ns)),
        ("etcd peer", curator::layout::etcd_pki(client.clone())),
    ];
    for (what, store) in stores {
        let ca = store
            .load_ca()
            .await
            .with_context(|| format!("loading the {what} CA"))?
            .ok_or_else(|| anyhow!("the cluster holds no {what} CA"))?;
        let crl = store
            .reissue_crl()
            .await
            .with_context(|| format!("signing the {what} CRL again"))?;
        tracing::info!(
            crl_number = pki::verified_crl_number(&crl, &ca.cert_der).unwrap_or_default(),
            "{what} CRL signed again, newer than any issued before"
        );
    }
    Ok(())
}

/// Every other node's record loses the etcd member ID it recorded: none of those members
/// belongs to the restored etcd cluster (its only member is this node). A former member
/// that still holds the role rejoins as a learner and records its new ID then. Only this
/// restore talks to the etcd it runs, so plain writes race nobody.
async fn mark_former_members(curator_ns: &consensus::Namespaced, node_id: &str) -> Result<()> {
    let nodes = curator::records::list_nodes(curator_ns)
        .await
        .context("listing the restored node records")?;
    for mut node in nodes.into_iter().filter(|n| n.id != node_id) {
        let Some(member) = node
            .roles
            .as_mut()
            .and_then(|roles| roles.consensus_member.as_mut())
            .filter(|member| member.member_id != 0)
        else {
            continue;
        };
        member.member_id = 0;
        curator_ns
            .client()
            .put(
                curator_ns.key(&curator::layout::node_key(&node.id)),
                node.encode_to_vec(),
                None,
            )
            .await
            .with_context(|| format!("marking node {} as no longer an etcd member", node.id))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_absent_or_empty_root_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("absent");
        assert!(!check_root_empty(&absent).unwrap());
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert!(check_root_empty(&empty).unwrap());
        std::fs::write(empty.join("x"), b"").unwrap();
        let e = check_root_empty(&empty).unwrap_err().to_string();
        assert!(
            e.contains("is not empty") && e.contains(empty.to_str().unwrap()),
            "{e}"
        );
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(
            check_root_empty(&file)
                .unwrap_err()
                .to_string()
                .contains("not a directory")
        );
    }

    #[test]
    fn a_live_cluster_is_refused_unless_forced_and_a_drill_keeps_off_members_addresses() {
        let ip = |last: u8| IpAddr::from([127, 0, 0, last]);
        let members = vec![
            ("a".to_string(), ip(1)),
            ("b".to_string(), ip(2)),
            ("c".to_string(), ip(3)),
        ];
        // At member a's address while b and c answer: a is only down for a moment.
        let why = refusal(ip(1), &members, &[ip(2), ip(3)], false, false).unwrap();
        assert!(why.contains("2 of the backup's 2 other"), "{why}");
        assert!(why.contains("b (127.0.0.2)"), "{why}");
        // One of two answering is no quorum: the cluster is lost, the restore goes on.
        assert_eq!(refusal(ip(1), &members, &[ip(2)], false, false), None);
        // At a new address: all three count.
        assert!(refusal(ip(9), &members, &[ip(1), ip(2)], false, false).is_some());
        assert_eq!(refusal(ip(9), &members, &[ip(1)], false, false), None);
        assert_eq!(refusal(ip(9), &members, &[ip(1), ip(2)], true, false), None);
        // A drill beside the live cluster, never at a member's address.
        assert_eq!(
            refusal(ip(9), &members, &[ip(1), ip(2), ip(3)], false, true),
            None
        );
        let why = refusal(ip(2), &members, &[], false, true).unwrap();
        assert!(why.contains("consensus member b"), "{why}");
        // A cluster of one member, restored at its address: nobody else to ask.
        assert_eq!(refusal(ip(1), &members[..1], &[], false, false), None);
    }

    #[test]
    fn clean_up_leaves_the_root_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("data/etcd")).unwrap();
        std::fs::write(root.join("lock"), b"1").unwrap();
        std::fs::write(root.join("data/etcd/x"), b"1").unwrap();
        clean_up(&root, true).unwrap();
        assert!(root.is_dir());
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
        std::fs::create_dir_all(root.join("esp")).unwrap();
        clean_up(&root, false).unwrap();
        assert!(!root.exists());
    }
}
