//! Register tickets (issue 15): they expire, run out and can be revoked one by one; a
//! listing never shows a secret; concurrent registrations cannot overspend one; a node
//! that registered keeps registering across restarts whatever became of its ticket.
//! One real cluster (polis-node, etcd) shared by the cases, on 127.x addresses.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use e2e::{Cluster, TIMEOUT, read_register_params, unique_loopback};
use proto::api;

/// `params register` with extra flags, into `dir/NAME.params`.
fn params(cluster: &Cluster, name: &str, extra: &[&str]) -> Result<PathBuf> {
    let path = cluster.dir.join(format!("{name}.params"));
    let mut args = vec![
        "params",
        "register",
        "--out",
        path.to_str().context("utf-8")?,
    ];
    args.extend_from_slice(extra);
    cluster.ctl_retry(&args)?;
    Ok(path)
}

/// RegisterNode with a new key (self-signed, as a new node calls it) and a new address,
/// called from that address (as a node does; the curator caps registrations per
/// source): the state it was registered in, or the refusal.
async fn register_new_key(
    endpoint: SocketAddr,
    params: &Path,
) -> Result<std::result::Result<i32, tonic::Status>> {
    let register = read_register_params(params)?;
    let key = identity::NodeKey::generate()?;
    let trust = rpc::ServerTrust::PinnedCa(register.ca_certificate.clone());
    let address = unique_loopback();
    let slot = rpc::CredentialSlot::new(rpc::self_signed(&key)?)?;
    let channel = rpc::connect_from(endpoint, &trust, Some(&slot), Some(address)).await?;
    let answer = api::curator_client::CuratorClient::new(channel)
        .register_node(api::RegisterNodeRequest {
            register_ticket: register.register_ticket.clone(),
            address: address.to_string(),
            ..Default::default()
        })
        .await;
    Ok(match answer {
        Ok(mut updates) => {
            let first = updates
                .get_mut()
                .message()
                .await?
                .context("the registration stream ended at once")?;
            Ok(first.state)
        }
        Err(status) => Err(status),
    })
}

fn refused_because(
    answer: &std::result::Result<i32, tonic::Status>,
    why: &str,
) -> std::result::Result<(), String> {
    match answer {
        Err(s) if s.code() == tonic::Code::PermissionDenied && s.message().contains(why) => Ok(()),
        other => Err(format!(
            "want PermissionDenied naming {why:?}, got {other:?}"
        )),
    }
}

/// `cluster tickets -o json`.
fn tickets(cluster: &Cluster) -> Result<Vec<serde_json::Value>> {
    let out = cluster.ctl_retry(&["cluster", "tickets", "-o", "json"])?;
    Ok(serde_json::from_str::<serde_json::Value>(&out)?
        .as_array()
        .cloned()
        .unwrap_or_default())
}

/// The id of the ticket in a parameters file (`<id>.<secret>`).
fn ticket_id(params: &Path) -> Result<String> {
    let ticket = read_register_params(params)?.register_ticket;
    let text = String::from_utf8(ticket).context("the ticket is text")?;
    Ok(text
        .split_once('.')
        .context("the ticket has an id")?
        .0
        .to_string())
}

fn block<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    tokio::task::block_in_place(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_tickets_expire_run_out_are_listed_without_secrets_and_revoked() -> Result<()> {
    // Before: one ticket without expiry or use count, and no way to list or revoke it
    // (`--uses`, `--ttl`, `cluster tickets` did not exist).
    let dir = tempfile::tempdir()?;
    let cluster = block(|| Cluster::bootstrap(dir.path()))?;
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);

    // --uses 1: one node registers, the second is refused as used up.
    let once = block(|| params(&cluster, "once", &["--uses", "1"]))?;
    assert_eq!(
        register_new_key(endpoint, &once).await??,
        1,
        "registered NEW"
    );
    let second = register_new_key(endpoint, &once).await?;
    refused_because(&second, "used up").map_err(anyhow::Error::msg)?;
    let id = ticket_id(&once)?;
    let listed = block(|| tickets(&cluster))?;
    let entry = listed
        .iter()
        .find(|t| t["id"] == id.as_str())
        .with_context(|| format!("ticket {id} not listed: {listed:?}"))?;
    assert_eq!(entry["uses_left"], 0, "{entry}");

    // A short --ttl: once it has passed, the ticket is refused as expired. Spent first,
    // so no poll before the expiry registers a node ("used up" until then).
    let short = block(|| params(&cluster, "short", &["--ttl", "2s", "--uses", "1"]))?;
    assert_eq!(register_new_key(endpoint, &short).await??, 1);
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let answer = register_new_key(endpoint, &short).await?;
        if refused_because(&answer, "has expired").is_ok() {
            break;
        }
        refused_because(&answer, "used up").map_err(anyhow::Error::msg)?;
        if std::time::Instant::now() > deadline {
            bail!("the 2s ticket was never refused as expired; last: {answer:?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }

    // The listing shows ids, times and uses, never a secret (in any format).
    let open = block(|| params(&cluster, "open", &[]))?;
    let secret = String::from_utf8(read_register_params(&open)?.register_ticket)?
        .split_once('.')
        .context("ticket format")?
        .1
        .to_string();
    let open_id = ticket_id(&open)?;
    for format in ["json", "yaml", "table"] {
        let out = block(|| cluster.ctl_retry(&["cluster", "tickets", "-o", format]))?;
        assert!(out.contains(&open_id), "{format}: {out}");
        assert!(!out.contains(&secret), "{format} shows a secret: {out}");
    }
    let listed = block(|| tickets(&cluster))?;
    let entry = listed
        .iter()
        .find(|t| t["id"] == open_id.as_str())
        .context("the open ticket is listed")?;
    assert!(entry["uses_left"].is_null(), "unlimited: {entry}");
    let keys: Vec<&String> = entry.as_object().context("an object")?.keys().collect();
    assert!(
        keys.iter()
            .all(|k| !k.contains("secret") && !k.contains("hash")),
        "{keys:?}"
    );

    // Revoked: refused from then on; revoking an unknown id fails.
    assert_eq!(register_new_key(endpoint, &open).await??, 1);
    block(|| cluster.ctl_retry(&["cluster", "ticket", "revoke", &open_id]))?;
    let after = register_new_key(endpoint, &open).await?;
    refused_because(&after, "wrong or was rotated or revoked").map_err(anyhow::Error::msg)?;
    let listed = block(|| tickets(&cluster))?;
    assert!(
        listed.iter().all(|t| t["id"] != open_id.as_str()),
        "{listed:?}"
    );
    let (ok, _, err) = block(|| cluster.ctl(&["cluster", "ticket", "revoke", &open_id]))?;
    assert!(!ok && err.contains("does not exist"), "{err}");
    let (ok, _, err) = block(|| cluster.ctl(&["cluster", "ticket", "revoke", "nonsense"]))?;
    assert!(!ok && err.contains("not a register ticket id"), "{err}");
    // Creating and revoking are audited; the revocation names the ticket, no secret.
    let audit = block(|| cluster.ctl_retry(&["cluster", "audit", "-o", "json"]))?;
    assert!(!audit.contains(&secret), "the audit log shows a secret");
    let entries: Vec<serde_json::Value> = audit
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let method =
        |e: &serde_json::Value, name: &str| e["method"].as_str().is_some_and(|m| m.ends_with(name));
    assert!(entries.iter().any(|e| method(e, "/CreateRegisterTicket")));
    assert!(
        entries
            .iter()
            .any(|e| method(e, "/RevokeRegisterTicket") && e["target"] == open_id.as_str()),
        "{audit}"
    );

    // Concurrent registrations with a one-use ticket: exactly one succeeds.
    let single = block(|| params(&cluster, "single", &["--uses", "1"]))?;
    const RACERS: usize = 8;
    let mut racers = Vec::new();
    for _ in 0..RACERS {
        let single = single.clone();
        racers.push(tokio::spawn(async move {
            register_new_key(endpoint, &single).await
        }));
    }
    let mut registered = 0;
    for racer in racers {
        match racer.await?? {
            Ok(_) => registered += 1,
            answer => refused_because(&answer, "used up").map_err(anyhow::Error::msg)?,
        }
    }
    assert_eq!(
        registered, 1,
        "a one-use ticket let {registered} nodes register"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_node_restarting_keeps_registering_after_its_ticket_is_gone() -> Result<()> {
    // A node that registered (NEW) and restarts before approval repeats RegisterNode
    // with the ticket in its parameters: it spends no use and is not refused although
    // its one-use ticket is used up and then expired.
    let dir = tempfile::tempdir()?;
    let cluster = block(|| Cluster::bootstrap(dir.path()))?;
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let params = block(|| params(&cluster, "worker", &["--uses", "1", "--ttl", "3s"]))?;
    let path = params.to_str().context("utf-8")?.to_string();
    let mut worker = cluster.new_node("worker")?;
    let id = block(|| {
        worker.start(&["--params", &path])?;
        worker.wait_state("Foreign")?;
        let id = worker.key_node_id()?;
        cluster.wait_node(&id, "NEW", None)?;
        Ok(id)
    })?;
    worker.proc().signal(libc::SIGKILL);
    block(|| worker.proc().wait_exit(TIMEOUT).map(drop))?;
    // Wait for the ticket to be refused as expired to anyone new.
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let answer = register_new_key(endpoint, &params).await?;
        if refused_because(&answer, "has expired").is_ok() {
            break;
        }
        refused_because(&answer, "used up").map_err(anyhow::Error::msg)?;
        if std::time::Instant::now() > deadline {
            bail!("the 3s ticket never expired: {answer:?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    block(|| {
        worker.start(&["--params", &path])?;
        worker.wait_state("Foreign")?;
        cluster.ctl_retry(&["node", "approve", &id])?;
        worker.wait_home()?;
        cluster.wait_node(&id, "UP", None)
    })?;
    let ticket = ticket_id(&params)?;
    let listed = block(|| tickets(&cluster))?;
    if let Some(t) = listed.iter().find(|t| t["id"] == ticket.as_str()) {
        assert_eq!(t["uses_left"], 0, "one use spent, no more: {t}");
    }
    Ok(())
}
