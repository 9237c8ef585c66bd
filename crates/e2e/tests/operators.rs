//! Operators and roles with real polis-node processes (a 2-member control plane) and
//! polisctl: each operator makes its own key (`polisctl key`), an admin adds it with a
//! role, the operator signs in with `takeownership`; what each role may do; bad input
//! refused by name; the audit log naming the operator; and a removal that revokes the
//! operator's certificate at once and ends its open streams (the audit log followed
//! through the follower curator, and a node's logs); a removed admin's open connection
//! loses its protected seat (issue 28): once a call on it is refused, strangers from its
//! address replace it like any other idle connection.
//!
//! One cluster for the whole file: the phases build on each other.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::{Cluster, TIMEOUT, endpoints, wait_until};
use proto::api;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

/// An operator's own config directory under the test's directory.
struct Operator {
    name: &'static str,
    config: PathBuf,
}

impl Operator {
    fn new(dir: &Path, name: &'static str) -> Operator {
        Operator {
            name,
            config: dir.join(format!("op-{name}")),
        }
    }

    /// polisctl with this operator's config: (success, stdout, stderr).
    fn ctl(&self, args: &[&str]) -> Result<(bool, String, String)> {
        let mut all = vec!["--config", self.config.to_str().context("utf-8 path")?];
        all.extend_from_slice(args);
        let (status, out, err) = e2e::polisctl(&all)?;
        Ok((status.success(), out, err))
    }

    /// `polisctl key --out FILE`: the key made in the config directory, its public half
    /// in FILE.
    fn make_key(&self, dir: &Path) -> Result<PathBuf> {
        let out = dir.join(format!("{}.pub", self.name));
        let (ok, _, err) = self.ctl(&["key", "--out", out.to_str().context("utf-8")?])?;
        ensure!(ok, "polisctl key: {err}");
        Ok(out)
    }

    fn take_ownership(&self, endpoint: &str) -> Result<String> {
        let (ok, out, err) =
            self.ctl(&["--endpoints", endpoint, "takeownership", "--accept-ca"])?;
        ensure!(ok, "takeownership as {}: {err}", self.name);
        Ok(out)
    }

    /// The credentials `takeownership` saved.
    fn credentials(&self) -> Result<rpc::Credentials> {
        let read = |name: &str| -> Result<Vec<u8>> {
            let text = std::fs::read_to_string(self.config.join(name))?;
            Ok(pem::parse(text)?.into_contents())
        };
        Ok(rpc::Credentials {
            certificate: read("owner.pem")?,
            key_pkcs8: read("owner-key.pem")?,
        })
    }

    fn follow(&self, dir: &Path, what: &str, args: &[&str]) -> Result<e2e::Proc> {
        let mut cmd = Command::new(e2e::bin("polisctl"));
        cmd.args(["--config", self.config.to_str().context("utf-8 path")?]);
        cmd.args(args);
        e2e::Proc::spawn(what, cmd, &dir.join(format!("{}-{what}.log", self.name)))
    }
}

/// Asserts that polisctl failed and said `needle`.
/// `polisctl cluster operator add NAME --role ROLE --key-file KEY` as the owner.
fn add_operator(cluster: &Cluster, name: &str, role: &str, key: &Path) -> Result<String> {
    let key = key.to_str().context("utf-8 path")?;
    cluster.ctl_retry(&[
        "cluster",
        "operator",
        "add",
        name,
        "--role",
        role,
        "--key-file",
        key,
    ])
}

fn refused(result: (bool, String, String), needle: &str, what: &str) -> Result<()> {
    let (ok, out, err) = result;
    ensure!(!ok, "{what} succeeded: {out}");
    ensure!(
        err.contains(needle),
        "{what}: the refusal does not say {needle:?}: {err}"
    );
    Ok(())
}

/// The cluster certificates of operator `name` (as the owner lists them).
fn certificates_of(cluster: &Cluster, name: &str) -> Result<Vec<Value>> {
    let out = cluster.ctl_retry(&["cluster", "certificates", "-o", "json"])?;
    let all: Vec<Value> = serde_json::from_str(&out)?;
    Ok(all
        .into_iter()
        .filter(|c| {
            c["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(&format!("operator-{name}.")))
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_roles_and_removal() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let (cluster, member) = tokio::task::block_in_place(|| -> Result<(Cluster, e2e::Node)> {
        let cluster = Cluster::bootstrap_with(dir, &[], &["--log-test-lines-per-second", "5"])?;
        let params = cluster.register_params("member")?;
        let (mut m1, id) = cluster.add_worker("m1", &params)?;
        cluster.ctl_retry(&["node", "add-role", &id, "ConsensusMember"])?;
        cluster.wait_members(&endpoints(&[&cluster.first, &m1]), 2, 0)?;
        m1.wait_for_curator()?;
        Ok((cluster, m1))
    })?;
    let endpoint = cluster.first.address.to_string();
    let first_id = cluster.first.key_node_id()?;
    let rita = Operator::new(dir, "rita");
    let ada = Operator::new(dir, "ada");
    let adm = Operator::new(dir, "adm");

    tokio::task::block_in_place(|| -> Result<()> {
        // A reader: key → add → takeownership, three times: one certificate recorded.
        let rita_pub = rita.make_key(dir)?;
        let text = std::fs::read_to_string(&rita_pub)?;
        ensure!(text.starts_with("-----BEGIN PUBLIC KEY-----"), "{text}");
        let path = |p: &Path| p.to_str().map(str::to_string).context("utf-8 path");
        add_operator(&cluster, "rita", "reader", &rita_pub)?;
        for _ in 0..3 {
            let out = rita.take_ownership(&endpoint)?;
            ensure!(
                out.contains("Signed in to the cluster as operator rita (reader)"),
                "{out}"
            );
        }
        let recorded = certificates_of(&cluster, "rita")?;
        ensure!(recorded.len() == 1, "rita's certificates: {recorded:?}");
        ensure!(recorded[0]["kind"] == "reader", "{recorded:?}");

        // Bad input, refused by name.
        let ada_pub = ada.make_key(dir)?;
        let add = |name: &str, role: &str, key: &Path| -> Result<(bool, String, String)> {
            cluster.ctl(&[
                "cluster",
                "operator",
                "add",
                name,
                "--role",
                role,
                "--key-file",
                &path(key)?,
            ])
        };
        refused(
            add("rita", "reader", &ada_pub)?,
            "exists already",
            "adding rita again",
        )?;
        refused(
            add("ada", "operator", &rita_pub)?,
            "operator \"rita\"",
            "adding rita's key",
        )?;
        refused(
            add("owner", "admin", &ada_pub)?,
            "reserved",
            "an operator named owner",
        )?;
        refused(
            add("Ada.x", "admin", &ada_pub)?,
            "invalid operator name",
            "a bad name",
        )?;
        refused(add("ada", "root", &ada_pub)?, "unknown role", "a bad role")?;
        refused(
            add("ada", "admin", &dir.join("missing.pub"))?,
            "missing.pub",
            "a missing key file",
        )?;
        let owner_pub = dir.join("owner.pub");
        let (ok, _, err) = cluster.ctl(&["key", "--out", &path(&owner_pub)?])?;
        ensure!(ok, "the owner's key: {err}");
        refused(
            add("ada", "admin", &owner_pub)?,
            "owner's key",
            "the owner's key",
        )?;
        refused(
            cluster.ctl(&["cluster", "operator", "remove", "nobody"])?,
            "no operator is named",
            "removing nobody",
        )?;

        // An operator labels; it is refused a backup (nothing written) and adding
        // ConsensusMember.
        add_operator(&cluster, "ada", "operator", &ada_pub)?;
        let out = ada.take_ownership(&endpoint)?;
        ensure!(out.contains("as operator ada (operator)"), "{out}");
        let (ok, _, err) = ada.ctl(&["node", "label", &first_id, "team=ada"])?;
        ensure!(ok, "ada labelling: {err}");
        let backup = dir.join("ada-backup.polis");
        refused(
            ada.ctl(&["cluster", "backup", "--out", &path(&backup)?])?,
            "requires",
            "ada's backup",
        )?;
        ensure!(!backup.exists(), "a refused backup left a file");
        refused(
            ada.ctl(&["node", "add-role", &first_id, "ConsensusMember"])?,
            "requires an admin",
            "ada adding ConsensusMember",
        )?;

        // The reader lists nodes and operators, and is refused a label and the audit log.
        let (ok, out, err) = rita.ctl(&["node", "list", "-o", "json"])?;
        ensure!(ok && out.contains(&first_id), "rita listing nodes: {err}");
        let (ok, out, err) = rita.ctl(&["cluster", "operator", "list", "-o", "json"])?;
        ensure!(ok, "rita listing operators: {err}");
        let listed: Vec<Value> = serde_json::from_str(&out)?;
        let names: Vec<&str> = listed.iter().filter_map(|o| o["name"].as_str()).collect();
        ensure!(names == ["ada", "rita"], "{listed:?}");
        refused(
            rita.ctl(&["node", "label", &first_id, "team=rita"])?,
            "requires",
            "rita labelling",
        )?;
        refused(
            rita.ctl(&["cluster", "audit"])?,
            "requires",
            "rita's audit log",
        )?;

        // A named admin lists operators, and is refused rotating the owner key.
        let adm_pub = adm.make_key(dir)?;
        add_operator(&cluster, "adm", "admin", &adm_pub)?;
        adm.take_ownership(&endpoint)?;
        let (ok, _, err) = adm.ctl(&["cluster", "operator", "list"])?;
        ensure!(ok, "adm listing operators: {err}");
        refused(
            adm.ctl(&["cluster", "owner", "rotate"])?,
            "requires the owner itself",
            "adm rotating the owner key",
        )?;
        Ok(())
    })?;

    // RotateOwner to an operator's key: refused (AlreadyExists), the owner unchanged.
    let owner = tokio::task::block_in_place(|| cluster.owner_client())?;
    let rita_key = {
        let creds = rita.credentials()?;
        identity::NodeKey::from_pkcs8(&creds.key_pkcs8)?.public_key()
    };
    let rotated = owner
        .call(|c| async move {
            api::management_client::ManagementClient::new(c)
                .rotate_owner(api::RotateOwnerRequest {
                    new_public_key: rita_key.to_vec(),
                })
                .await
        })
        .await;
    match rotated {
        Err(rpc::CallError::Status(s)) if s.code() == tonic::Code::AlreadyExists => {}
        other => anyhow::bail!("RotateOwner to rita's key: {other:?}"),
    }

    // The audit log names the operator (entries are written just after the call).
    tokio::task::block_in_place(|| -> Result<()> {
        let entries = || -> Result<Vec<Value>> {
            let out = cluster.ctl_retry(&["cluster", "audit", "-o", "json"])?;
            Ok(out
                .lines()
                .map(serde_json::from_str)
                .collect::<Result<_, _>>()?)
        };
        let by_ada = |e: &Value| {
            e["method"]
                .as_str()
                .is_some_and(|m| m.ends_with("/UpdateNodeLabels"))
                && e["identity_kind"] == "operator"
        };
        wait_until("ada's label write in the audit log", TIMEOUT, || {
            entries().is_ok_and(|all| all.iter().any(by_ada))
        })?;
        let all = entries()?;
        let label = all.iter().find(|e| by_ada(e)).context("no entry")?;
        ensure!(
            label["identity"]
                .as_str()
                // Its certificate's serial where the leader served it, its key where
                // a follower forwarded it.
                .is_some_and(|i| i.starts_with("ada (operator), ")),
            "{label}"
        );
        let added = all
            .iter()
            .find(|e| {
                e["method"]
                    .as_str()
                    .is_some_and(|m| m.ends_with("/AddOperator"))
                    && e["code"] == 0
            })
            .context("no AddOperator entry")?;
        ensure!(added["target"] == "rita", "{added}");
        Ok(())
    })?;

    // Ada's streams: the audit log followed through the follower curator (forwarded to
    // the leader, which holds no certificate of hers), and the member's logs.
    let leader = tokio::task::block_in_place(|| cluster.first.curator_leader_address())?;
    let follower = [cluster.first.address, member.address]
        .into_iter()
        .find(|a| *a != leader)
        .context("a curator that does not lead")?;
    let ca = std::fs::read(cluster.first.root.join("data/node/ca.der"))?;
    let channel = rpc::connect(
        SocketAddr::new(follower, rpc::CURATOR_PORT),
        &rpc::ServerTrust::PinnedCa(ca.clone()),
        Some(&ada.credentials()?),
    )
    .await?;
    let mut audit = api::audit_client::AuditClient::new(channel.clone())
        .audit_log(api::AuditLogRequest {
            follow: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    audit
        .message()
        .await?
        .context("ada's audit stream: a first entry")?;
    // One caller holds at most 16 followed audit logs (`curator::service::follows`),
    // counted on the leader by her forwarded identity: each of these holds a
    // connection of its own from the follower to the leader.
    let follow = || {
        let channel = channel.clone();
        async move {
            api::audit_client::AuditClient::new(channel)
                .audit_log(api::AuditLogRequest {
                    follow: true,
                    ..Default::default()
                })
                .await
        }
    };
    let mut more = Vec::new();
    for _ in 1..16 {
        more.push(follow().await?.into_inner());
    }
    let refused_follow = follow()
        .await
        .err()
        .context("a 17th follow of ada's was served")?;
    ensure!(
        refused_follow.code() == tonic::Code::ResourceExhausted
            && refused_follow.message().contains("16 times"),
        "{refused_follow:?}"
    );
    // A follow that ends gives its seat back.
    more.pop();
    let again = tokio::time::timeout(TIMEOUT, async {
        loop {
            match follow().await {
                Ok(stream) => return stream.into_inner(),
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            }
        }
    })
    .await
    .context("no follow of ada's was served again after one ended")?;
    drop((more, again));
    let member_id = tokio::task::block_in_place(|| member.key_node_id())?;
    let mut logs = tokio::task::block_in_place(|| {
        ada.follow(
            dir,
            "logs",
            &["node", "logs", &member_id, "-f", "-o", "json"],
        )
    })?;
    tokio::task::block_in_place(|| logs.wait_for_line(TIMEOUT, |l| l.contains("log test line")))?;

    let out = tokio::task::block_in_place(|| {
        cluster.ctl_retry(&["cluster", "operator", "remove", "ada"])
    })?;
    ensure!(out.contains("1 certificate(s) revoked"), "{out}");

    // Both streams end, saying so.
    let ended = tokio::time::timeout(TIMEOUT, async {
        loop {
            match audit.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return Err(anyhow::anyhow!("the audit stream ended without a reason")),
                Err(status) => return Ok(status),
            }
        }
    })
    .await
    .context("ada's followed audit log never ended")??;
    ensure!(ended.message().contains("revoked"), "{ended:?}");
    tokio::task::block_in_place(|| -> Result<()> {
        let status = logs.wait_exit(TIMEOUT)?;
        ensure!(!status.success(), "ada's log follower exited successfully");
        ensure!(logs.output().contains("revoked"), "{}", logs.output());

        // Her next call is refused, and her key no longer escrows.
        wait_until("ada's calls refused", TIMEOUT, || {
            ada.ctl(&["node", "list"]).is_ok_and(|(ok, _, _)| !ok)
        })?;
        refused(
            ada.take_ownership_result(&endpoint)?,
            "nor an operator's key",
            "ada escrowing after removal",
        )?;
        let listed = cluster.ctl_retry(&["cluster", "operator", "list", "-o", "json"])?;
        ensure!(!listed.contains("\"ada\""), "{listed}");
        Ok(())
    })?;

    // A removed admin's connection: proven (never evicted, not counted against its
    // address) while her calls were an admin's; refused once removed, it counts again
    // and is the first to go when strangers from her address fill its cap.
    let source = e2e::unique_loopback();
    let tls = rpc::tls::client_config(&rpc::ServerTrust::PinnedCa(ca), Some(&adm.credentials()?))?;
    let (adm_channel, mut closed) = one_connection(
        SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT),
        source,
        tls,
    )
    .await?;
    let list = || {
        let channel = adm_channel.clone();
        async move {
            api::management_client::ManagementClient::new(channel)
                .list_nodes(api::ListNodesRequest::default())
                .await
        }
    };
    list()
        .await
        .context("adm listing nodes before her removal")?;
    let out = tokio::task::block_in_place(|| {
        cluster.ctl_retry(&["cluster", "operator", "remove", "adm"])
    })?;
    ensure!(out.contains("1 certificate(s) revoked"), "{out}");
    let refusal = tokio::time::timeout(TIMEOUT, async {
        loop {
            match list().await {
                // The CRL change not seen here yet.
                Ok(_) => {}
                Err(s) if s.code() == tonic::Code::Unavailable => {}
                Err(s) => return s,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .context("adm's calls on her open connection were never refused")?;
    ensure!(
        refusal.code() == tonic::Code::Unauthenticated,
        "adm's call on her open connection: {refusal:?}"
    );
    ensure!(
        !*closed.borrow(),
        "the connection closed with the refusal instead of counting again"
    );
    // Strangers from her address up to its cap of connections without a node's or an
    // admin's identity: hers counts among them, and goes (the oldest idle).
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let mut strangers = Vec::new();
    for _ in 0..rpc::Limits::PRODUCTION.per_source_connections {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(source, 0))?;
        strangers.push(socket.connect(endpoint).await?);
    }
    tokio::time::timeout(TIMEOUT, closed.wait_for(|c| *c))
        .await
        .context(
            "the removed admin's connection was not closed for strangers of its address: \
             its seat still counts as proven",
        )??;
    drop(strangers);
    drop(member);
    Ok(())
}

/// A stream that says when the server closed it (a read ends or fails).
struct Watched<S> {
    inner: S,
    closed: watch::Sender<bool>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let (room, before) = (buf.remaining() > 0, buf.filled().len());
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let ended = match &polled {
            Poll::Ready(Err(_)) => true,
            Poll::Ready(Ok(())) => room && buf.filled().len() == before,
            Poll::Pending => false,
        };
        if ended {
            self.closed.send_replace(true);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A channel over one TLS connection from `source` to `endpoint` (it never connects
/// again: a call after the server closed it fails), and what says that it closed.
async fn one_connection(
    endpoint: SocketAddr,
    source: IpAddr,
    tls: Arc<rustls::ClientConfig>,
) -> Result<(tonic::transport::Channel, watch::Receiver<bool>)> {
    let (closed, watching) = watch::channel(false);
    let once = Arc::new(Mutex::new(Some(closed)));
    let connector = tokio_rustls::TlsConnector::from(tls);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{endpoint}"))?
        .connect_with_connector(tower::service_fn(move |_: tonic::codegen::http::Uri| {
            let (connector, once) = (connector.clone(), once.clone());
            async move {
                let closed = once
                    .lock()
                    .expect("lock")
                    .take()
                    .ok_or_else(|| std::io::Error::other("this channel connects once"))?;
                let socket = tokio::net::TcpSocket::new_v4()?;
                socket.bind(SocketAddr::new(source, 0))?;
                let tcp = socket.connect(endpoint).await?;
                let name = rustls::pki_types::ServerName::IpAddress(endpoint.ip().into());
                let inner = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(Watched { inner, closed }))
            }
        }))
        .await?;
    Ok((channel, watching))
}

impl Operator {
    fn take_ownership_result(&self, endpoint: &str) -> Result<(bool, String, String)> {
        self.ctl(&["--endpoints", endpoint, "takeownership", "--accept-ca"])
    }
}

/// Owner (and so operator) certificate lifetime in the renewal test, seconds.
const SHORT_LIFETIME: u64 = 15;

#[test]
fn an_operators_certificate_renews_itself_without_a_failed_call() -> Result<()> {
    // polisctl renews an operator's certificate as it does the owner's (at 2/3 of its
    // lifetime, AAA.Escrow with its key): a reader calling throughout three lifetimes
    // holds at least three certificates in turn, and no call fails.
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let lifetime = format!("{SHORT_LIFETIME}s");
    let cluster = Cluster::bootstrap_with(dir, &["--owner-certificate-lifetime", &lifetime], &[])?;
    let rita = Operator::new(dir, "rita");
    let key_file = rita.make_key(dir)?;
    add_operator(&cluster, "rita", "reader", &key_file)?;
    rita.take_ownership(&cluster.first.address.to_string())?;
    let certificate = rita.config.join("owner.pem");
    let mut serials = std::collections::BTreeSet::new();
    let mut failures = Vec::new();
    let mut calls = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3 * SHORT_LIFETIME);
    while std::time::Instant::now() < deadline {
        let (ok, _, err) = rita.ctl(&["node", "list", "-o", "json"])?;
        calls += 1;
        if !ok {
            failures.push(err);
        }
        let der = pem::parse(std::fs::read_to_string(&certificate)?)?.into_contents();
        serials.insert(pki::certificate_serial(&der)?);
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    println!("{calls} reader calls, {} certificates", serials.len());
    ensure!(failures.is_empty(), "failed calls: {failures:#?}");
    ensure!(
        serials.len() >= 3,
        "the reader's certificate renewed {} times",
        serials.len() - 1
    );
    // Every one of them recorded under its name, none revoked.
    let recorded = certificates_of(&cluster, "rita")?;
    ensure!(recorded.len() >= 3, "{recorded:#?}");
    ensure!(
        recorded.iter().all(|c| c["revoked"] == false),
        "{recorded:#?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_holds_at_most_256_operators() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let cluster = tokio::task::block_in_place(|| Cluster::bootstrap(tmp.path()))?;
    let owner = tokio::task::block_in_place(|| cluster.owner_client())?;
    let add = |n: usize| {
        let owner = &owner;
        async move {
            let request = api::AddOperatorRequest {
                name: format!("op{n}"),
                role: "reader".into(),
                public_key: identity::NodeKey::generate()?.public_key().to_vec(),
            };
            anyhow::Ok(
                owner
                    .call(|c| {
                        let request = request.clone();
                        async move {
                            api::management_client::ManagementClient::new(c)
                                .add_operator(request)
                                .await
                        }
                    })
                    .await,
            )
        }
    };
    for n in 0..proto::operators::MAX_OPERATORS {
        add(n).await??;
    }
    match add(proto::operators::MAX_OPERATORS).await? {
        Err(rpc::CallError::Status(s)) if s.code() == tonic::Code::ResourceExhausted => {
            ensure!(s.message().contains("256"), "{s:?}");
        }
        other => anyhow::bail!("the 257th operator: {other:?}"),
    }
    // Removing one makes room for one.
    owner
        .call(|c| async move {
            api::management_client::ManagementClient::new(c)
                .remove_operator(api::RemoveOperatorRequest { name: "op7".into() })
                .await
        })
        .await?;
    add(1000).await??;
    Ok(())
}
