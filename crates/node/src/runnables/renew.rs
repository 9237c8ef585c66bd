//! Certificate renewal: the `root.role.renew` runnable keeps the node's certificates
//! fresh without restarting anything.
//!
//! ```text
//!   node certificate (data/node/cert.der) ─┐ due at 2/3 of its lifetime
//!   etcd peer certificate (data/etcd/peer/ ├─▶ Curator.RenewCertificates(peer) ─▶ new ones
//!     cert.pem, consensus members only)   ─┘   (same key; old ones stay valid until
//!                                               they expire, nothing is revoked)
//!        ▼ written atomically, then applied live:
//!   node certificate ──▶ NodeValues::credentials (rpc::CredentialSlot): the curator's
//!                        TLS server presents it from the next handshake on; every
//!                        CuratorClient and the curator's forwarding channel connect
//!                        anew with it before their next call
//!   peer certificate ──▶ cert.pem: etcd 3.4 reads --peer-cert-file/--peer-key-file on
//!                        every new peer handshake (both directions), so the file is all
//! ```
//! A node certificate the signing CA did not issue (a CA rotation promoted another,
//! the first of the CAs the node trusts) is renewed at once, whatever its age, and so
//! is a peer certificate the signing etcd peer CA did not issue (the first of
//! `NodeValues::etcd_peer_cas`): the runnable looks every ROTATION_CHECK. A renewed
//! peer certificate must come from a peer CA the member was told to trust.
//! A failed renewal is retried with backoff (never waiting past a quarter of the time
//! left) and logged once per problem. The runnable wakes at least every 1/12 of the
//! shortest lifetime (capped at a minute), so a peer certificate that appeared since
//! (the node joined consensus) is looked at in time.
//!
//! Touches only the certificate files and the credential slot: may not change roles,
//! the cluster state or the curator list.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use pki::Validity;
use proto::api;

use crate::curators::curator_client::{curator_client, install_node_certificate};
use crate::curators::retry::{Backoff, ProblemLog, pause};
use crate::disk::files::read_pem_certificate;
use crate::disk::storage::{pem, write_atomic};
use crate::state::cluster_state::ClusterState;
use crate::state::settings::Settings;
use crate::state::values::NodeValues;

/// Longest sleep between two looks at the certificates.
const MAX_NAP: Duration = Duration::from_secs(60);

/// What is due, at `now` (Unix seconds), for a node certificate and maybe a peer one.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Nothing before `until` (Unix seconds).
    Wait { until: u64 },
    /// Renew now; `peer`: the peer certificate too.
    Renew { peer: bool },
}

/// The renewal decision (pure): the node certificate is renewed at 2/3 of its lifetime,
/// and so is the peer certificate; when one is renewed, the other goes along if it is
/// due within a sixth of its lifetime (so that the two keep step, one call for both).
/// Waits are cut to 1/12 of the shortest lifetime, at most [`MAX_NAP`].
pub fn plan(node: Validity, peer: Option<Validity>, now: u64) -> Plan {
    let node_due = node.renew_at();
    let peer_due = peer.map(|p| p.renew_at());
    let early = |v: Validity, due: u64| now + v.lifetime() / 6 >= due;
    if now >= node_due || peer_due.is_some_and(|d| now >= d) {
        return Plan::Renew {
            peer: peer.is_some_and(|p| early(p, p.renew_at())),
        };
    }
    let shortest = peer
        .map(|p| p.lifetime())
        .unwrap_or(u64::MAX)
        .min(node.lifetime());
    let nap = (shortest / 12).clamp(1, MAX_NAP.as_secs());
    let due = peer_due.map_or(node_due, |p| p.min(node_due));
    Plan::Wait {
        until: due.min(now + nap),
    }
}

/// The `root.role.renew` runnable (see the module documentation).
/// How often a node looks at whether a CA rotation made its certificate one to replace
/// (a local check: no call).
const ROTATION_CHECK: Duration = Duration::from_secs(2);

pub async fn run(
    ctx: supervisor::Context,
    settings: Settings,
    values: NodeValues,
) -> supervisor::RunnableResult {
    let mut state = values.cluster_state.watch();
    tokio::select! {
        s = state.get_matching(|s| *s == ClusterState::Home) => { s?; }
        _ = ctx.cancelled() => return Ok(()),
    }
    let slot = values.credentials.slot(&settings.root)?;
    let client = curator_client(&settings, &values)?;
    ctx.signal_healthy();
    let peer_file = settings.root.etcd_peer_dir().join("cert.pem");
    let mut problems = ProblemLog::default();
    let mut backoff = Backoff::default();
    loop {
        let node = Validity::of(&slot.credentials().certificate)
            .context("reading the node certificate's validity")?;
        let member = values.roles.current().is_some_and(|r| r.consensus_member);
        let peer_der = if member {
            read_pem_certificate(&peer_file).ok()
        } else {
            None
        };
        let peer = peer_der.as_ref().and_then(|der| Validity::of(der).ok());
        // An etcd peer CA rotation made another peer CA sign: the peer certificate is
        // replaced at once too.
        let peer_replaced = peer_der.as_ref().is_some_and(|der| {
            values
                .etcd_peer_cas
                .current()
                .and_then(|cas| cas.first().cloned())
                .is_some_and(|signing| !pki::issued_by(der, &signing))
        });
        let now = pki::unix_now();
        // A CA rotation made another CA sign (the first one trusted): the node
        // certificate is replaced at once, whatever its age.
        let replaced = values
            .trust
            .cas()
            .first()
            .is_some_and(|signing| !pki::issued_by(&slot.credentials().certificate, signing));
        let peer = match plan(node, peer, now) {
            Plan::Renew { peer } => peer || peer_replaced,
            Plan::Wait { .. } if replaced || peer_replaced => peer_replaced,
            Plan::Wait { until } => {
                // Looked at again within ROTATION_CHECK: a rotation does not wait for
                // the renewal a certificate's age calls for.
                let wait = Duration::from_secs(until.saturating_sub(now).max(1));
                if !pause(&ctx, wait.min(ROTATION_CHECK)).await {
                    return Ok(());
                }
                continue;
            }
        };
        client.set_endpoints(values.curators.current().unwrap_or_default());
        let renewed = tokio::select! {
            r = renew(&settings, &values, &client, &slot, peer, &peer_file) => r,
            _ = ctx.cancelled() => return Ok(()),
        };
        match renewed {
            Ok(()) => {
                problems.resolved("certificates renewed again");
                backoff.reset();
                // A certificate renewed on a clock far behind could be due again at
                // once: never renew more than once a second.
                if !pause(&ctx, Duration::from_secs(1)).await {
                    return Ok(());
                }
            }
            Err(e) => {
                problems.problem(format!(
                    "renewing this node's certificates: {}",
                    supervisor::error_chain(e.as_ref())
                ));
                let left = node.not_after.saturating_sub(pki::unix_now());
                let wait = backoff
                    .next()
                    .min(Duration::from_secs(left / 4))
                    .max(Duration::from_millis(200));
                if !pause(&ctx, wait).await {
                    return Ok(());
                }
            }
        }
    }
}

/// One renewal: asks, checks, writes, applies.
async fn renew(
    settings: &Settings,
    values: &NodeValues,
    client: &rpc::CuratorClient,
    slot: &rpc::CredentialSlot,
    peer: bool,
    peer_file: &Path,
) -> Result<()> {
    let answer = client
        .call(|channel| async move {
            api::curator_client::CuratorClient::new(channel)
                .renew_certificates(api::RenewCertificatesRequest { peer })
                .await
        })
        .await?;
    let current = slot.credentials();
    let own_key = pki::certificate_public_key(&current.certificate)?;
    if pki::certificate_public_key(&answer.node_certificate)? != own_key {
        bail!("the curator answered with a node certificate for another key");
    }
    // The curator issues only when renewal is due by its clock; before, it answers with
    // the certificates this node holds.
    let node_renewed = answer.node_certificate != current.certificate;
    let peer_renewed = peer
        && !answer.peer_certificate.is_empty()
        && read_pem_certificate(peer_file).ok().as_deref()
            != Some(answer.peer_certificate.as_slice());
    if !node_renewed && !peer_renewed {
        bail!(
            "the curator answered with the certificates this node holds: by its clock renewal \
             is not due yet (do the clocks of this node and the curators differ?)"
        );
    }
    if node_renewed {
        install_node_certificate(settings, slot, &answer.node_certificate)?;
        let validity = Validity::of(&answer.node_certificate)?;
        tracing::info!(
            serial = hex::encode(pki::certificate_serial(&answer.node_certificate)?),
            expires_in_s = validity.not_after.saturating_sub(pki::unix_now()),
            "node certificate renewed and in use"
        );
    }
    if peer_renewed {
        if pki::certificate_public_key(&answer.peer_certificate)? != own_key {
            bail!("the curator answered with an etcd peer certificate for another key");
        }
        // Only a CA the cluster trusts for etcd peers now: etcd refuses (on the other
        // members) a certificate of any other.
        let ca_file = peer_file.with_file_name("ca.pem");
        let trusted = values
            .etcd_peer_cas
            .current()
            .filter(|cas| !cas.is_empty())
            .map_or_else(|| read_pem_certificate(&ca_file).map(|ca| vec![ca]), Ok)?;
        if !trusted.contains(&answer.peer_ca_certificate) {
            return Err(anyhow!(
                "the curator answered with an etcd peer certificate of a CA this member's etcd \
                 is not told to trust (SHA256:{})",
                rpc::fingerprint(&answer.peer_ca_certificate)
            ));
        }
        // Only while the node still is a member (its peer files are there): the control
        // plane may have been stopped and its files wiped meanwhile.
        if !values.roles.current().is_some_and(|r| r.consensus_member) || !peer_file.exists() {
            tracing::info!(
                "not a consensus member any more: the renewed peer certificate is unused"
            );
            return Ok(());
        }
        write_atomic(peer_file, &pem("CERTIFICATE", &answer.peer_certificate))
            .context("saving the renewed etcd peer certificate")?;
        tracing::info!(
            serial = hex::encode(pki::certificate_serial(&answer.peer_certificate)?),
            "etcd peer certificate renewed; etcd uses it from its next peer handshake"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issued(at: u64, lifetime: u64) -> Validity {
        Validity {
            not_before: at - pki::BACKDATE.as_secs(),
            not_after: at + lifetime,
        }
    }

    #[test]
    fn renewal_plans() {
        let year = 365 * 86400;
        let cases = [
            // Node only, 30 s issued at 1000: renew at 1020, look every 2 s.
            (issued(1000, 30), None, 1000, Plan::Wait { until: 1002 }),
            (issued(1000, 30), None, 1019, Plan::Wait { until: 1020 }),
            (issued(1000, 30), None, 1020, Plan::Renew { peer: false }),
            (issued(1000, 30), None, 1100, Plan::Renew { peer: false }),
            // A year: look once a minute.
            (issued(1000, year), None, 1000, Plan::Wait { until: 1060 }),
            // Peer due first: both go (the node's is due within a sixth).
            (
                issued(1000, 30),
                Some(issued(998, 30)),
                1018,
                Plan::Renew { peer: true },
            ),
            // Node due, peer issued much later: node only.
            (
                issued(1000, 30),
                Some(issued(1015, 30)),
                1020,
                Plan::Renew { peer: false },
            ),
            // Node due, peer due within 5 s (a sixth of 30 s): both.
            (
                issued(1000, 30),
                Some(issued(1004, 30)),
                1020,
                Plan::Renew { peer: true },
            ),
            // 6 s lifetimes: naps of at least a second.
            (issued(1000, 6), None, 1000, Plan::Wait { until: 1001 }),
        ];
        for (node, peer, now, expected) in cases {
            assert_eq!(plan(node, peer, now), expected, "{node:?} {peer:?} {now}");
        }
    }
}
