//! CuratorLocal: served by every curator, leader or not, to anyone.

use proto::api;
use tonic::{Request, Response, Status};

use super::{Services, status_from};
use crate::election;

#[tonic::async_trait]
impl api::curator_local_server::CuratorLocal for Services {
    async fn get_current_leader(
        &self,
        _: Request<api::GetCurrentLeaderRequest>,
    ) -> Result<Response<api::GetCurrentLeaderResponse>, Status> {
        let leader = election::current_leader(&self.0.curator)
            .await
            .map_err(status_from)?
            .unwrap_or_default();
        Ok(Response::new(api::GetCurrentLeaderResponse {
            leader_node_id: leader.node_id,
            leader_endpoint: leader.endpoint,
            this_node_id: self.0.config.node_id.clone(),
        }))
    }

    async fn get_ca_certificate(
        &self,
        _: Request<api::GetCaCertificateRequest>,
    ) -> Result<Response<api::GetCaCertificateResponse>, Status> {
        Ok(Response::new(api::GetCaCertificateResponse {
            ca_certificate: self.0.config.ca_certificate.clone(),
        }))
    }
}
