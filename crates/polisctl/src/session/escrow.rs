//! Proving the owner key to the cluster (AAA.Escrow with a self-signed certificate) for a
//! new owner certificate, and when the stored owner certificate is due for renewal.
//! Used by taking ownership and by the owner session; may not touch the config directory.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use identity::NodeKey;
use proto::api;

use super::errors::call_failure;

/// Proves the owner key (self-signed certificate) and receives a new owner certificate:
/// taking ownership, and renewing the owner certificate.
pub(crate) async fn escrow(
    endpoints: &[SocketAddr],
    cas: &[Vec<u8>],
    key: &NodeKey,
    key_path: &Path,
    what: &str,
) -> Result<api::EscrowResponse> {
    let self_signed = rpc::self_signed(key)?;
    // Any of the pinned CAs (one, or two during a CA rotation), without a CRL, as the
    // first contact is.
    let pinned = rpc::TrustSlot::new(cas.first().context("no cluster CA pinned")?.clone());
    pinned.trust(cas.to_vec())?;
    let trust = rpc::ServerTrust::ClusterCa { trust: pinned };
    let public_key = key.public_key().to_vec();
    let client = rpc::CuratorClient::new(endpoints.to_vec(), trust, Some(self_signed))?;
    let response = client
        .call(|channel| {
            let public_key = public_key.clone();
            async move {
                api::aaa_client::AaaClient::new(channel)
                    .escrow(api::EscrowRequest { public_key })
                    .await
            }
        })
        .await
        .map_err(|f| match f {
            rpc::CallError::Status(s) if s.code() == tonic::Code::PermissionDenied => anyhow!(
                "{what}: permission denied: the key in {} is not this cluster's owner key, \
                 nor an operator's key",
                key_path.display()
            ),
            other => call_failure(what, other),
        })?;
    if !cas.contains(&response.ca_certificate) {
        bail!("the curator answered with a CA that is not pinned; refusing");
    }
    Ok(response)
}

/// The CAs the cluster trusts now (the signing one first), asked of a curator checked
/// against `pinned` (the CAs pinned and the saved CRLs: a removed member's curator
/// certificate is refused) without a client certificate. Refused unless the answer keeps
/// one of the CAs pinned (a rotation moves one step at a time).
pub(crate) async fn current_cas(
    endpoints: &[SocketAddr],
    pinned: rpc::TrustSlot,
) -> Result<Vec<Vec<u8>>> {
    let cas = pinned.cas();
    let client = rpc::CuratorClient::new(
        endpoints.to_vec(),
        rpc::ServerTrust::ClusterCa {
            trust: pinned.clone(),
        },
        None,
    )?;
    let answer = client
        .call(|channel| async move {
            api::curator_local_client::CuratorLocalClient::new(channel)
                .get_ca_certificate(api::GetCaCertificateRequest::default())
                .await
        })
        .await
        .map_err(|f| call_failure("asking for the cluster CAs", f))?;
    if answer.trusted_cas.is_empty() {
        return Ok(cas);
    }
    pinned.trust(answer.trusted_cas.clone())?;
    Ok(answer.trusted_cas)
}

/// What to do with the stored owner certificate at `now` (Unix seconds): renew it once
/// 2/3 of its lifetime have passed (as nodes do), and refuse to go on without a
/// renewal once it has expired.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum OwnerCertificate {
    Fresh,
    RenewDue,
    Expired,
}

pub(crate) fn owner_certificate_state(validity: pki::Validity, now: u64) -> OwnerCertificate {
    if now >= validity.not_after {
        OwnerCertificate::Expired
    } else if now >= validity.renew_at() {
        OwnerCertificate::RenewDue
    } else {
        OwnerCertificate::Fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_certificates_renew_at_two_thirds() {
        let b = pki::BACKDATE.as_secs();
        let v = pki::Validity {
            not_before: 1000 - b,
            not_after: 1030,
        };
        for (now, expected) in [
            (1000, OwnerCertificate::Fresh),
            (1019, OwnerCertificate::Fresh),
            (1020, OwnerCertificate::RenewDue),
            (1029, OwnerCertificate::RenewDue),
            (1030, OwnerCertificate::Expired),
        ] {
            assert_eq!(owner_certificate_state(v, now), expected, "{now}");
        }
    }
}
