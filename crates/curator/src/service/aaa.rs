//! AAA: the owner proves the owner key and receives an owner certificate, valid for the
//! cluster configuration's owner certificate lifetime; an operator proves its key and
//! receives its certificate (`operators::escrow`: marked with its role, recorded under
//! its record's guard, a new one only once renewal is due). Escrowing again (polisctl does,
//! once 2/3 of that lifetime passed) is how an owner renews: each call issues a new
//! certificate (`issuance`), recorded as `owner-<serial>`; older ones stay valid until
//! they expire. The recording is guarded by the owner key as it was checked (see
//! `owner`): an Escrow racing a rotation never leaves an unrevoked certificate for the
//! old key.

use proto::api;
use tonic::{Request, Response, Status};

use super::shared::Services;
use super::status::{self_signed_key, status_from};
use super::{issuance, operators};
use crate::owner;

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
        let owner = owner::read_owner_key(&self.0.curator)
            .await
            .map_err(status_from)?;
        let (owner_certificate, ca_certificate) = match owner
            .filter(|(key, _)| crate::operators::same_key(key, &subject))
        {
            Some((_, guard)) => {
                issuance::escrow_owner_certificate(&self.0, &subject, guard).await?
            }
            None => {
                let Some((operator, guard)) =
                    crate::operators::holder_of(&self.0.curator, &subject)
                        .await
                        .map_err(status_from)?
                else {
                    tracing::warn!("escrow refused: key is neither the owner's nor an operator's");
                    return Err(Status::permission_denied(
                        "this key is neither the cluster owner's key nor an operator's key",
                    ));
                };
                operators::escrow(&self.0, &operator, &subject, guard).await?
            }
        };
        Ok(Response::new(api::EscrowResponse {
            owner_certificate,
            ca_certificate,
        }))
    }
}
