//! AAA: the owner proves the owner key and receives an owner certificate, valid for the
//! cluster configuration's owner certificate lifetime. Escrowing again (polisctl does,
//! once 2/3 of that lifetime passed) is how an owner renews: each call issues a new
//! certificate, recorded as `owner-<serial>`; older ones stay valid until they expire.

use proto::api;
use tonic::{Request, Response, Status};

use super::{Services, self_signed_key, status_from};
use crate::state;

#[tonic::async_trait]
impl api::aaa_server::Aaa for Services {
    async fn escrow(
        &self,
        request: Request<api::EscrowRequest>,
    ) -> Result<Response<api::EscrowResponse>, Status> {
        let subject = self_signed_key(&request)?;
        if request.get_ref().public_key != subject {
            return Err(Status::invalid_argument(
                "the requested key is not the key of the client certificate",
            ));
        }
        let _leadership = self.0.leadership().await?;
        let owner = state::initial_owner(&self.0.curator)
            .await
            .map_err(status_from)?;
        if owner.as_deref() != Some(subject.as_slice()) {
            tracing::warn!("escrow refused: key is not the cluster owner's");
            return Err(Status::permission_denied(
                "this key is not the cluster owner's key",
            ));
        }
        let lifetime = state::owner_certificate_lifetime(Some(&self.0.configuration().await?));
        let (store, ca) = self.0.cluster_ca().await?;
        let template = pki::Template {
            common_name: "owner".into(),
            dns_names: vec![],
            ip_addresses: vec![],
            usage: pki::Usage::Client,
            lifetime,
            kind: pki::CertificateKind::Owner,
        };
        let issued = ca
            .issue(&template, &subject)
            .map_err(|e| Status::internal(format!("issuing the owner certificate: {e}")))?;
        let name = format!("owner-{}", hex::encode(&issued.serial));
        // Not guarded by leadership (the PKI store takes no guard): a deposed leader could
        // still record a certificate it issued, for a key that is the owner's anyway.
        let certificate = store
            .ensure_certificate(&name, || Ok(issued.clone()))
            .await
            .map_err(|e| Status::unavailable(format!("recording the owner certificate: {e}")))?;
        tracing::info!(
            serial = hex::encode(&issued.serial),
            "issued an owner certificate"
        );
        Ok(Response::new(api::EscrowResponse {
            owner_certificate: certificate,
            ca_certificate: ca.cert_der,
        }))
    }
}
