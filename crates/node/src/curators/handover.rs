//! Catching up with CA rotations a node missed (off, or cut off, while `rotate-ca
//! --force` moved on and retired the CA it trusts): the curators' certificates chain
//! to no CA it trusts, so it asks them (unverified) for the CA they present and the
//! rotations' handovers, and trusts that CA only when the handovers lead to it from a
//! CA it trusts (`pki::handed_over`), as polisctl does.
//!
//! ```text
//!   ask(endpoints): GetCACertificate(with_handovers), FirstUse, bounded ──▶ answer
//!   successor(trusted, answer) (pure):
//!     presented CA trusted already ───────────────────────────▶ None (nothing missed)
//!     handovers lead from a trusted CA to the presented one ──▶ Some([presented, trusted…])
//!     no chain (another cluster, a stranger at that address) ─▶ Err (trust unchanged)
//! ```
//! Following a handover proves no more than the CA trusted already would: whoever holds
//! that CA's key could sign one. Its users bound what that key can still do: the
//! locked data unlock (`datadev`) only asks for a half the device itself verifies; the
//! running node (`catchup`) follows only while its node certificate of the old CA is
//! valid (the same bound the curator applies when it reissues that certificate), so a
//! retired key is of no use against a node once the node's certificate of it expired.
//!
//! A leaf: imports only `rpc`, `pki`, `proto`; may not write to the root.

use std::net::SocketAddr;
use std::time::Duration;

use proto::api;

/// How long one curator gets to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long all of them get.
const ALL_TIMEOUT: Duration = Duration::from_secs(15);

/// The first answer of `endpoints` to GetCACertificate with the handovers, asked without
/// verifying the curators (what they answer is checked by [`successor`]); None when
/// none answers in time.
pub async fn ask(endpoints: &[SocketAddr]) -> Option<api::GetCaCertificateResponse> {
    let one = async |endpoint: SocketAddr| -> Result<api::GetCaCertificateResponse, String> {
        let channel = rpc::connect(endpoint, &rpc::ServerTrust::FirstUse, None)
            .await
            .map_err(|e| e.to_string())?;
        api::curator_local_client::CuratorLocalClient::new(channel)
            .get_ca_certificate(api::GetCaCertificateRequest {
                with_handovers: true,
            })
            .await
            .map(|r| r.into_inner())
            .map_err(|s| s.message().to_string())
    };
    let all = async {
        for endpoint in endpoints {
            match tokio::time::timeout(ASK_TIMEOUT, one(*endpoint)).await {
                Ok(Ok(answer)) => return Some(answer),
                Ok(Err(e)) => tracing::debug!(%endpoint, "asking for the CA's handovers: {e}"),
                Err(_) => tracing::debug!(%endpoint, "asking for the CA's handovers: no answer"),
            }
        }
        None
    };
    tokio::time::timeout(ALL_TIMEOUT, all).await.ok().flatten()
}

/// Why a presented CA is not followed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NotFollowed {
    #[error(
        "the curators present the cluster CA SHA256:{presented}, and no handover leads there \
         from a CA this node trusts (another cluster at these endpoints, or rotations it \
         missed made by a Polis from before handovers)"
    )]
    NoChain { presented: String },
}

/// The CAs to trust after the rotations `answer` shows (pure): the presented CA first,
/// then those trusted now (the slot drops them as the next WatchNode update names the
/// cluster's list). None when the presented CA is trusted already.
pub fn successor(
    trusted: &[Vec<u8>],
    answer: &api::GetCaCertificateResponse,
) -> Result<Option<Vec<Vec<u8>>>, NotFollowed> {
    let presented = &answer.ca_certificate;
    if trusted.contains(presented) {
        return Ok(None);
    }
    if !pki::handed_over(trusted, &answer.handovers, presented) {
        return Err(NotFollowed::NoChain {
            presented: rpc::fingerprint(presented),
        });
    }
    let mut cas = vec![presented.clone()];
    // The slot holds at most MAX_TRUSTED_CAS: the newest trusted ones stay (first).
    cas.extend(trusted.iter().take(rpc::tls::MAX_TRUSTED_CAS - 1).cloned());
    Ok(Some(cas))
}

/// Follows the handovers `answer` shows into `slot` (in memory), and takes the
/// presented CA's CRL: true when the slot trusts another CA now.
pub fn follow(
    slot: &rpc::TrustSlot,
    answer: &api::GetCaCertificateResponse,
) -> anyhow::Result<bool> {
    let Some(cas) = successor(&slot.cas(), answer)? else {
        return Ok(false);
    };
    slot.trust(cas)?;
    if !answer.crl.is_empty()
        && let Err(e) = slot.offer(&answer.crl)
    {
        tracing::warn!("the presented CA's CRL is unusable: {e}");
    }
    tracing::warn!(
        ca = rpc::fingerprint(&answer.ca_certificate),
        "the cluster CA was rotated while this node was away: followed its handovers"
    );
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(presented: &pki::Ca, handovers: Vec<Vec<u8>>) -> api::GetCaCertificateResponse {
        api::GetCaCertificateResponse {
            ca_certificate: presented.cert_der.clone(),
            handovers,
            ..Default::default()
        }
    }

    #[test]
    fn a_chain_from_a_trusted_ca_is_followed_and_nothing_else() {
        let old = pki::Ca::generate("old", pki::CA_LIFETIME).unwrap();
        let mid = pki::Ca::generate("mid", pki::CA_LIFETIME).unwrap();
        let new = pki::Ca::generate("new", pki::CA_LIFETIME).unwrap();
        let stranger = pki::Ca::generate("stranger", pki::CA_LIFETIME).unwrap();
        let trusted = vec![old.cert_der.clone()];
        // Nothing missed.
        assert_eq!(successor(&trusted, &answer(&old, vec![])), Ok(None));
        // Two rotations missed: followed, the presented CA first.
        let chain = vec![
            old.hand_over_to(&mid).unwrap(),
            mid.hand_over_to(&new).unwrap(),
        ];
        assert_eq!(
            successor(&trusted, &answer(&new, chain)),
            Ok(Some(vec![new.cert_der.clone(), old.cert_der.clone()]))
        );
        // A stranger's CA, or a handover the trusted CA did not sign: refused.
        assert!(successor(&trusted, &answer(&stranger, vec![])).is_err());
        let forged = vec![stranger.hand_over_to(&new).unwrap()];
        assert!(successor(&trusted, &answer(&new, forged)).is_err());
    }

    #[test]
    fn a_followed_ca_is_trusted_by_the_slot() {
        let old = pki::Ca::generate("old", pki::CA_LIFETIME).unwrap();
        let new = pki::Ca::generate("new", pki::CA_LIFETIME).unwrap();
        let slot = rpc::TrustSlot::new(old.cert_der.clone());
        let shown = answer(&new, vec![old.hand_over_to(&new).unwrap()]);
        assert!(follow(&slot, &shown).unwrap());
        assert_eq!(slot.cas(), vec![new.cert_der.clone(), old.cert_der.clone()]);
        // Again: nothing to follow.
        assert!(!follow(&slot, &shown).unwrap());
    }
}
