//! The register path of the cluster manager: a fresh node becomes a member of an
//! existing cluster.
//!
//! ```text
//!   node key (new, or the one an interrupted registration left) ── written first
//!     │ self-signed certificate; curator's certificate must chain to the CA pinned in
//!     │ the parameters (never trust on first use here) and not be on the newest CRL:
//!     │ the parameters' own, or a newer one any curator hands out (`crlfetch`, asked
//!     │ again before every attempt)
//!     ▼
//!   RegisterNode(ticket) ──stream──▶ NEW ........................ ClusterState::Foreign
//!                                    STANDBY (owner approved) ... ClusterState::Trusted
//!   CommitNode ──▶ node certificate, CA, roles, curator endpoints
//!     ▼
//!   node certificate, CA, CRL, roles, cluster directory written; sealed configuration LAST
//!     ▼
//!   Membership::Join (a worker: no etcd, no curator) ──▶ role server ──▶ Home
//! ```
//! Every call is idempotent on the curator's side, so a crash or a lost reply at any
//! point resumes here on the next start with the same key: RegisterNode answers the
//! record's current state, CommitNode the certificate it issued the first time.
//! Approval arrives on the RegisterNode stream (a watch), not by polling.
//!
//! A start path, run by the cluster manager: it publishes only the cluster states it
//! passes (Foreign, Trusted); may not start runnables or touch other shared values.

use std::net::IpAddr;

use anyhow::{Context as _, Result, anyhow, bail};
use identity::NodeKey;
use proto::api::{self, NodeState};
use proto::config::{
    ClusterDirectory, ClusterRegister, NodeParameters, SealedConfiguration, node_parameters,
};

use crate::curators::crlfetch;
use crate::curators::curator_client::local_source;
use crate::curators::retry::{Answer, Backoff, ProblemLog, call_until_answered, pause};
use crate::disk::datakeys;
use crate::disk::files::{parse_endpoints, read_node_key};
use crate::disk::storage::{Root, read_proto, write_atomic, write_proto};
use crate::process::crash::crash_point;
use crate::state::cluster_state::ClusterState;
use crate::state::membership::{JoinData, roles_from_names};

/// Whether a failed call can never succeed by retrying: the curator refused this node
/// (wrong ticket, decommissioned key, bad input) or the parameters pin the wrong CA.
fn permanent(e: &rpc::CallError) -> bool {
    use tonic::Code;
    e.all_untrusted()
        || matches!(e, rpc::CallError::Status(s)
            if matches!(s.code(), Code::PermissionDenied | Code::InvalidArgument | Code::Unauthenticated))
}

fn refusal(e: rpc::CallError, params_what: &str) -> anyhow::Error {
    if e.revoked_server() && e.all_untrusted() {
        anyhow!(
            "no curator named in {params_what} may be trusted, and one presents a revoked \
             certificate (a node removed from the cluster): name the cluster's current \
             curators in the parameters: {e}"
        )
    } else if e.all_untrusted() {
        anyhow!(
            "no curator named in {params_what} presents a certificate of the cluster CA pinned there \
             (wrong CA in the parameters, parameters made before a CA rotation: make new ones \
             with `polisctl params register`, or the endpoints belong to another cluster): {e}"
        )
    } else {
        anyhow!("the cluster refused this node's registration: {e}")
    }
}

/// The node key of an interrupted registration, or a new one (written before any call,
/// so that a crash resumes with the same key).
fn load_or_create_key(root: &Root) -> Result<NodeKey> {
    let path = root.node_key();
    if path.exists() {
        let key = read_node_key(root)?;
        tracing::info!(
            node_id = key.node_id(),
            "resuming an interrupted registration"
        );
        return Ok(key);
    }
    let key = NodeKey::generate().context("generating the node key")?;
    write_atomic(&path, key.pkcs8_der()).context("saving the node key")?;
    tracing::info!(
        node_id = key.node_id(),
        "registering into an existing cluster"
    );
    Ok(key)
}

/// Runs the register path to its end. `None` when cancelled first.
pub async fn register(
    ctx: &supervisor::Context,
    root: &Root,
    address: IpAddr,
    params: &ClusterRegister,
    params_what: &str,
    cluster_state: &event::Value<ClusterState>,
) -> Result<Option<JoinData>> {
    let key = load_or_create_key(root)?;
    let node_id = key.node_id();
    crash_point("register-key");
    let endpoints = parse_endpoints(&params.curator_endpoints)?;
    // A curator on the CRL is refused at the handshake, however it came to be named
    // here (a removed member's address in old parameters).
    // One that is not the pinned CA's is left out (logged): the CA is what decides, and
    // a wrong one is refused as such at the first contact.
    let crl = rpc::TrustSlot::new(params.ca_certificate.clone());
    crlfetch::offer(&crl, &params.crl, params_what);
    let client = rpc::CuratorClient::new(
        endpoints.clone(),
        rpc::ServerTrust::ClusterCa { trust: crl.clone() },
        Some(rpc::self_signed(&key).context("creating the self-signed registration certificate")?),
    )
    .context("loading the self-signed registration certificate")?
    .with_source(local_source(address));
    let data = datakeys::registration(root)?;
    let request = api::RegisterNodeRequest {
        register_ticket: params.register_ticket.clone(),
        address: address.to_string(),
        labels: params.labels.clone(),
        data_join_key: data.as_ref().map(|d| d.0.clone()).unwrap_or_default(),
        data_cluster_half: data.map(|d| d.1).unwrap_or_default(),
    };
    let mut problems = ProblemLog::default();
    let mut backoff = Backoff::default();

    // Register, then wait on the stream until the owner approves.
    'register: loop {
        tokio::select! {
            () = crlfetch::gather(&crl, &endpoints) => {}
            _ = ctx.cancelled() => return Ok(None),
        }
        let call = client.call(|channel| {
            let request = request.clone();
            async move {
                api::curator_client::CuratorClient::new(channel)
                    .register_node(request)
                    .await
            }
        });
        let mut stream = tokio::select! {
            r = call => match r {
                Ok(s) => s,
                Err(e) if permanent(&e) => return Err(refusal(e, params_what)),
                Err(e) => {
                    tracing::debug!("registration attempt failed: {e}");
                    problems.problem(format!("registering with the cluster: {e}"));
                    if !pause(ctx, backoff.next()).await {
                        return Ok(None);
                    }
                    continue;
                }
            },
            _ = ctx.cancelled() => return Ok(None),
        };
        problems.resolved("reached a curator");
        backoff.reset();
        loop {
            let update = tokio::select! {
                u = stream.message() => u,
                _ = ctx.cancelled() => return Ok(None),
            };
            match update {
                Ok(Some(u)) if u.state == NodeState::New as i32 => {
                    if cluster_state.current() != Some(ClusterState::Foreign) {
                        cluster_state.set(ClusterState::Foreign);
                        tracing::info!(
                            node_id,
                            "registered; waiting for the owner to approve this node (polisctl node approve {node_id})"
                        );
                        crash_point("register-foreign");
                    }
                }
                Ok(Some(u))
                    if u.state == NodeState::Standby as i32 || u.state == NodeState::Up as i32 =>
                {
                    break 'register;
                }
                Ok(Some(u)) => bail!(
                    "the cluster reports this node in state {:?}; it cannot join",
                    NodeState::try_from(u.state).unwrap_or(NodeState::Invalid)
                ),
                // The curator went away (failover, restart): register again, which only
                // reads the record now.
                Ok(None) | Err(_) => {
                    problems.problem("the curator closed the registration stream".into());
                    if !pause(ctx, backoff.next()).await {
                        return Ok(None);
                    }
                    continue 'register;
                }
            }
        }
    }
    cluster_state.set(ClusterState::Trusted);
    tracing::info!(node_id, "approved by the owner; committing");
    crash_point("register-trusted");

    let commit = |channel| async move {
        api::curator_client::CuratorClient::new(channel)
            .commit_node(api::CommitNodeRequest {})
            .await
    };
    let committed = match call_until_answered(ctx, &client, "committing", permanent, commit).await {
        Answer::Ok(c) => c,
        Answer::Refused(e) => return Err(refusal(e, params_what)),
        Answer::Cancelled => return Ok(None),
    };
    crash_point("register-committed");
    if committed.ca_certificate != params.ca_certificate {
        bail!("the curator answered with a CA other than the one pinned in {params_what}");
    }
    let certified = pki::certificate_public_key(&committed.node_certificate)
        .context("the curator sent an unreadable node certificate")?;
    if certified != key.public_key() {
        bail!("the curator sent a node certificate for another key");
    }
    let roles = roles_from_names(&committed.roles);
    // A role given between a commit and its retry is fine: the role server starts the
    // control plane, which joins consensus like for any role change.
    let directory = ClusterDirectory {
        curator_endpoints: if committed.curator_endpoints.is_empty() {
            params.curator_endpoints.clone()
        } else {
            committed.curator_endpoints.clone()
        },
        ..Default::default()
    };
    write_atomic(&root.node_certificate(), &committed.node_certificate)
        .context("saving the node certificate")?;
    write_atomic(&root.cluster_ca(), &committed.ca_certificate)
        .context("saving the cluster CA certificate")?;
    if let Some(crl) = crl.crl_of(&params.ca_certificate) {
        crlfetch::save(root, &crl)?;
    }
    write_proto(&root.local_roles(), &roles).context("saving the node's roles")?;
    write_proto(&root.directory(), &directory).context("saving the cluster directory")?;
    crash_point("register-credentials");
    let sealed = SealedConfiguration {
        node_id: node_id.clone(),
        cluster_ca_certificate: committed.ca_certificate,
        address: address.to_string(),
        etcd_cluster_id: 0,
        etcd_member_id: 0,
    };
    write_proto(&root.sealed_configuration(), &sealed)
        .context("writing the sealed configuration")?;
    crash_point("register-sealed");
    tracing::info!(node_id, "joined the cluster; sealed configuration written");
    forget_ticket(root);
    // The cluster keeps the cluster half of the data key since RegisterNode.
    if let Err(e) = datakeys::forget_pending(root) {
        tracing::warn!("{e:#}; it is removed on the next start");
    }
    Ok(Some(JoinData {
        key,
        sealed,
        roles,
        directory: parse_endpoints(&directory.curator_endpoints)?,
    }))
}

/// Once sealed, the node never reads its parameters again: the register ticket is
/// removed from the parameters in its root (the ticket lets anyone holding it ask to
/// join; it is the owner's, not this node's, to keep). Parameters passed with `--params`
/// from outside the root are the operator's file: they are named, not changed. A failure
/// is logged: the node belongs to its cluster either way.
fn forget_ticket(root: &Root) {
    let path = root.default_parameters();
    if !path.exists() {
        tracing::info!(
            "the register parameters came from outside the node root: delete them once \
             every node they were meant for has joined (they hold the register ticket)"
        );
        return;
    }
    let forgotten = (|| -> Result<bool> {
        let mut parameters: NodeParameters = read_proto(&path, "node parameters")?;
        let Some(node_parameters::Cluster::Register(register)) = parameters.cluster.as_mut() else {
            return Ok(false);
        };
        if register.register_ticket.is_empty() {
            return Ok(false);
        }
        register.register_ticket.clear();
        write_proto(&path, &parameters)?;
        Ok(true)
    })();
    match forgotten {
        Ok(true) => {
            tracing::info!(path = %path.display(), "removed the register ticket from the node parameters")
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(
            path = %path.display(),
            "could not remove the register ticket from the node parameters: {e:#}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    #[test]
    fn only_refusals_and_a_wrong_ca_are_permanent() {
        use tonic::{Code, Status};
        let status = |c| rpc::CallError::Status(Status::new(c, "x"));
        assert!(permanent(&status(Code::PermissionDenied)));
        assert!(permanent(&status(Code::InvalidArgument)));
        assert!(!permanent(&status(Code::Unavailable)));
        assert!(!permanent(&status(Code::FailedPrecondition)));
        let endpoint: SocketAddr = "127.0.0.9:7835".parse().unwrap();
        let untrusted = || rpc::RpcError::UntrustedServer {
            endpoint,
            reason: "UnknownIssuer".into(),
        };
        let down = || rpc::RpcError::Connect {
            endpoint,
            reason: "refused".into(),
        };
        assert!(permanent(&rpc::CallError::Unreachable(vec![untrusted()])));
        assert!(!permanent(&rpc::CallError::Unreachable(vec![
            untrusted(),
            down()
        ])));
        assert!(!permanent(&rpc::CallError::Unreachable(vec![])));
    }
}
