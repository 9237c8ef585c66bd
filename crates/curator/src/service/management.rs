//! Management: the users' API (the owner and operators, by role: `rpc::authz`). Nodes may read cluster status too, but a node sees only
//! its own record (ListNodes, DescribeNode): its credentials let it act as that node and
//! nothing more; the curators it needs come with its WatchNode stream.
//!
//! Handlers check the request and build the answer: role changes are `membership`'s,
//! decommission and deletion `decommission`'s, record writes `writes`'.

use std::collections::BTreeMap;

use proto::api;
use tonic::{Request, Response, Status};

use super::shared::Services;
use super::status::{check_node_id, identity, node_update_status, status_from};
use super::{ca_rotation, certificates, decommission, membership, operators, removal, tickets};
use crate::error::NodeUpdateError;
use crate::lifecycle::Event;
use crate::{layout, records, writes};

fn node_matches(node: &api::NodeInfo, filter: &api::ListNodesRequest) -> bool {
    (filter.state == 0 || node.state == filter.state)
        && (filter.role.is_empty()
            || node
                .roles
                .iter()
                .any(|r| r.eq_ignore_ascii_case(&filter.role)))
        && filter
            .labels
            .iter()
            .all(|(k, v)| node.labels.get(k) == Some(v))
}

/// Whether `caller` may see the record of node `id`: owners see every record, a node
/// only its own.
fn may_see(caller: &rpc::Identity, id: &str) -> bool {
    match caller {
        rpc::Identity::Node { id: own, .. } => own == id,
        _ => true,
    }
}

#[tonic::async_trait]
impl api::management_server::Management for Services {
    async fn get_cluster_info(
        &self,
        _: Request<api::GetClusterInfoRequest>,
    ) -> Result<Response<api::GetClusterInfoResponse>, Status> {
        self.0.leadership().await?;
        let nodes = records::list_nodes(&self.0.curator)
            .await
            .map_err(status_from)?;
        let configuration = records::cluster_configuration(&self.0.curator)
            .await
            .map_err(status_from)?;
        Ok(Response::new(api::GetClusterInfoResponse {
            // The signing CA: after a rotation, the one certificates chain to now.
            ca_certificate: self.0.trusted.current().map_or_else(
                || self.0.config.ca_certificate.clone(),
                |t| t.current.cert.clone(),
            ),
            cluster_configuration: configuration,
            curator_endpoints: records::curator_endpoints(&nodes),
            node_count: nodes.len() as u32,
        }))
    }

    async fn list_nodes(
        &self,
        request: Request<api::ListNodesRequest>,
    ) -> Result<Response<api::ListNodesResponse>, Status> {
        let leadership = self.0.leadership().await?;
        let caller = identity(&request);
        let filter = request.into_inner();
        let mut records: Vec<proto::state::Node> = match self.0.fresh_nodes(&leadership).await {
            Some(snapshot) => snapshot
                .nodes
                .values()
                .filter(|n| n.id > filter.after_id)
                .cloned()
                .collect(),
            None => records::list_nodes(&self.0.curator)
                .await
                .map_err(status_from)?
                .into_iter()
                .filter(|n| n.id > filter.after_id)
                .collect(),
        };
        records.retain(|n| may_see(&caller, &n.id));
        records.sort_by(|a, b| a.id.cmp(&b.id));
        let mut nodes: Vec<api::NodeInfo> = self
            .0
            .node_infos(records, &leadership)
            .into_iter()
            .filter(|n| node_matches(n, &filter))
            .collect();
        // A page: what one answer can carry however large the cluster (0: everything,
        // as clients before paging ask).
        let page = filter.page_size as usize;
        let more = page > 0 && nodes.len() > page;
        if more {
            nodes.truncate(page);
        }
        Ok(Response::new(api::ListNodesResponse { nodes, more }))
    }

    async fn describe_node(
        &self,
        request: Request<api::DescribeNodeRequest>,
    ) -> Result<Response<api::NodeInfo>, Status> {
        let id = &request.get_ref().id;
        check_node_id(id)?;
        if !may_see(&identity(&request), id) {
            return Err(Status::permission_denied(format!(
                "a node may describe only itself, not node {id}"
            )));
        }
        let leadership = self.0.leadership().await?;
        let record = match self.0.fresh_nodes(&leadership).await {
            Some(snapshot) => snapshot.nodes.get(id).cloned(),
            None => records::load_node(&self.0.curator, id)
                .await
                .map_err(status_from)?,
        };
        match record {
            Some(node) => Ok(Response::new(self.0.node_info(node, &leadership))),
            None => Err(Status::not_found(format!("node {id} does not exist"))),
        }
    }

    async fn update_node_labels(
        &self,
        request: Request<api::UpdateNodeLabelsRequest>,
    ) -> Result<Response<api::UpdateNodeLabelsResponse>, Status> {
        check_node_id(&request.get_ref().id)?;
        let leadership = self.0.leadership().await?;
        let caller = identity(&request);
        let r = request.into_inner();
        let upsert: BTreeMap<String, String> = r.upsert.into_iter().collect();
        let node =
            writes::update_node_labels(&self.0.curator, &leadership, &r.id, &upsert, &r.delete)
                .await
                .map_err(node_update_status)?;
        // The audit log records every label change (with its caller); a line per write
        // in the node's log would cost as much as the write's own work.
        tracing::debug!(node = r.id, %caller, "updated node labels");
        Ok(Response::new(api::UpdateNodeLabelsResponse {
            node: Some(self.0.node_info(node, &leadership)),
        }))
    }

    /// Kept for earlier clients: a new ticket with the default lifetime and unlimited
    /// uses (see CreateRegisterTicket).
    async fn get_register_ticket(
        &self,
        request: Request<api::GetRegisterTicketRequest>,
    ) -> Result<Response<api::GetRegisterTicketResponse>, Status> {
        let defaults = api::CreateRegisterTicketRequest {
            ttl_seconds: crate::ticket::DEFAULT_TTL.as_secs(),
            uses: 0,
        };
        let created = tickets::create(&self.0, &identity(&request), defaults).await?;
        Ok(Response::new(api::GetRegisterTicketResponse {
            ticket: created.ticket,
        }))
    }

    async fn rotate_register_ticket(
        &self,
        request: Request<api::RotateRegisterTicketRequest>,
    ) -> Result<Response<api::RotateRegisterTicketResponse>, Status> {
        tickets::rotate(&self.0, &identity(&request)).await?;
        Ok(Response::new(api::RotateRegisterTicketResponse {}))
    }

    async fn approve_node(
        &self,
        request: Request<api::ApproveNodeRequest>,
    ) -> Result<Response<api::ApproveNodeResponse>, Status> {
        let id = request.get_ref().id.clone();
        check_node_id(&id)?;
        let leadership = self.0.leadership().await?;
        let node = writes::apply_event(
            &self.0.curator,
            &leadership,
            &id,
            None,
            Event::Approve,
            Default::default,
            self.0.known_record(&id),
        )
        .await
        .map_err(|e| match e {
            NodeUpdateError::Transition {
                source: crate::lifecycle::TransitionError::NotRegistered,
                ..
            } => Status::not_found(format!("node {id} does not exist")),
            other => node_update_status(other),
        })?;
        tracing::info!(node = id, caller = %identity(&request), "approved node");
        Ok(Response::new(api::ApproveNodeResponse {
            node: Some(self.0.node_info(node, &leadership)),
        }))
    }

    async fn update_node_roles(
        &self,
        request: Request<api::UpdateNodeRolesRequest>,
    ) -> Result<Response<api::UpdateNodeRolesResponse>, Status> {
        let caller = identity(&request);
        let r = request.into_inner();
        check_node_id(&r.id)?;
        // (consensus member, Kubernetes controller, Kubernetes worker) named.
        let known = |names: &[String]| -> Result<(bool, bool, bool), Status> {
            let mut named = (false, false, false);
            for name in names {
                if name.eq_ignore_ascii_case(proto::ROLE_CONSENSUS_MEMBER) {
                    named.0 = true;
                } else if name.eq_ignore_ascii_case(proto::ROLE_KUBERNETES_CONTROLLER) {
                    named.1 = true;
                } else if name.eq_ignore_ascii_case(proto::ROLE_KUBERNETES_WORKER) {
                    named.2 = true;
                } else {
                    let shown: String = name.chars().take(40).collect();
                    return Err(Status::invalid_argument(format!(
                        "unknown role {shown:?}; the roles are: {}, {}, {}",
                        proto::ROLE_CONSENSUS_MEMBER,
                        proto::ROLE_KUBERNETES_CONTROLLER,
                        proto::ROLE_KUBERNETES_WORKER
                    )));
                }
            }
            Ok(named)
        };
        let (add, remove) = (known(&r.add)?, known(&r.remove)?);
        if (add.0 && remove.0) || (add.1 && remove.1) || (add.2 && remove.2) {
            return Err(Status::invalid_argument(
                "a role cannot be added and removed at once",
            ));
        }
        // A consensus member's etcd holds the cluster CA's private key, a Kubernetes
        // controller holds a system:masters credential and the service-account key, and
        // a worker runs whatever pods the cluster schedules on it: whoever could give
        // any to a node it controls could take the cluster.
        if (add.0 || add.1 || add.2) && !caller.holds(pki::OperatorRole::Admin) {
            return Err(Status::permission_denied(format!(
                "adding {} requires an admin; caller is {caller}",
                if add.0 {
                    proto::ROLE_CONSENSUS_MEMBER
                } else if add.1 {
                    proto::ROLE_KUBERNETES_CONTROLLER
                } else {
                    proto::ROLE_KUBERNETES_WORKER
                }
            )));
        }
        let leadership = self.0.leadership().await?;
        let load = || async {
            records::load_node(&self.0.curator, &r.id)
                .await
                .map_err(status_from)?
                .ok_or_else(|| Status::not_found(format!("node {} does not exist", r.id)))
        };
        if remove.0 && !remove.1 && super::kubernetes::is_controller(&load().await?) {
            return Err(Status::failed_precondition(format!(
                "node {} holds {}, which requires {}: remove {} first",
                r.id,
                proto::ROLE_KUBERNETES_CONTROLLER,
                proto::ROLE_CONSENSUS_MEMBER,
                proto::ROLE_KUBERNETES_CONTROLLER
            )));
        }
        let mut node = None;
        if remove.1 {
            node = Some(super::kubernetes::remove_role(&self.0, &leadership, &r.id).await?);
        }
        if remove.0 {
            node = Some(removal::remove_role(&self.0, &leadership, &r.id).await?);
        }
        if add.0 {
            node = Some(membership::add_role(&self.0, &leadership, &r.id).await?);
        }
        if add.1 {
            node = Some(super::kubernetes::add_role(&self.0, &leadership, &r.id).await?);
        }
        if add.2 {
            node = Some(super::kubernetes::add_worker(&self.0, &leadership, &r.id).await?);
        }
        if remove.2 {
            node = Some(super::kubernetes::remove_worker(&self.0, &leadership, &r.id).await?);
        }
        let node = match node {
            Some(node) => node,
            None => load().await?,
        };
        tracing::info!(node = r.id, %caller, add = ?r.add, remove = ?r.remove, "updated node roles");
        Ok(Response::new(api::UpdateNodeRolesResponse {
            node: Some(self.0.node_info(node, &leadership)),
        }))
    }

    async fn decommission_node(
        &self,
        request: Request<api::DecommissionNodeRequest>,
    ) -> Result<Response<api::DecommissionNodeResponse>, Status> {
        let id = request.get_ref().id.clone();
        check_node_id(&id)?;
        let leadership = self.0.leadership().await?;
        let node = decommission::start(&self.0, &leadership, &id).await?;
        tracing::info!(node = id, caller = %identity(&request), "decommissioning node");
        Ok(Response::new(api::DecommissionNodeResponse {
            node: Some(self.0.node_info(node, &leadership)),
        }))
    }

    async fn delete_node(
        &self,
        request: Request<api::DeleteNodeRequest>,
    ) -> Result<Response<api::DeleteNodeResponse>, Status> {
        let id = request.get_ref().id.clone();
        check_node_id(&id)?;
        let leadership = self.0.leadership().await?;
        let node = decommission::delete(&self.0, &leadership, &id).await?;
        tracing::info!(
            node = id,
            state = crate::lifecycle::state_name(records::node_state(&node)),
            caller = %identity(&request),
            "deleted node; its key cannot register again"
        );
        Ok(Response::new(api::DeleteNodeResponse {}))
    }

    async fn issue_kubernetes_credentials(
        &self,
        request: Request<api::IssueKubernetesCredentialsRequest>,
    ) -> Result<Response<api::IssueKubernetesCredentialsResponse>, Status> {
        let caller = identity(&request);
        let leadership = self.0.leadership().await?;
        let answer =
            super::kubernetes::issue_for_user(&self.0, &leadership, &caller, request.into_inner())
                .await?;
        tracing::info!(%caller, user = answer.user, group = answer.group, "issued Kubernetes credentials");
        Ok(Response::new(answer))
    }

    async fn list_certificates(
        &self,
        _request: Request<api::ListCertificatesRequest>,
    ) -> Result<Response<api::ListCertificatesResponse>, Status> {
        self.0.leadership().await?;
        let mut certificates = certificates::list(&self.0.curator)
            .await
            .map_err(status_from)?;
        certificates.sort_by(|a, b| {
            (&a.kind, &a.node_id, a.not_before_unix, &a.name).cmp(&(
                &b.kind,
                &b.node_id,
                b.not_before_unix,
                &b.name,
            ))
        });
        Ok(Response::new(api::ListCertificatesResponse {
            certificates,
        }))
    }

    async fn rotate_owner(
        &self,
        request: Request<api::RotateOwnerRequest>,
    ) -> Result<Response<api::RotateOwnerResponse>, Status> {
        let caller = identity(&request);
        // Only the owner itself: an admin who rotated it would hold the owner key, an
        // owner no operator removal reaches.
        if !matches!(caller, rpc::Identity::User { .. }) {
            return Err(Status::permission_denied(format!(
                "rotating the owner key requires the owner itself; caller is {caller}"
            )));
        }
        let new_key: [u8; 32] = request
            .get_ref()
            .new_public_key
            .as_slice()
            .try_into()
            .map_err(|_| {
                Status::invalid_argument("the new owner key must be 32 bytes (Ed25519)")
            })?;
        let leadership = self.0.leadership().await?;
        // The key first: from then on the old key cannot escrow a new certificate, and
        // the revocation below catches every certificate issued for it. Refused when an
        // operator holds the key (checked and written under one guard).
        crate::operators::replace_owner_key(&self.0.curator, &leadership, &new_key)
            .await
            .map_err(|e| match e {
                crate::operators::OperatorError::KeyTaken(_) => {
                    Status::already_exists(format!("refused: {e}"))
                }
                crate::operators::OperatorError::Changed => Status::aborted(e.to_string()),
                e => Status::unavailable(e.to_string()),
            })?;
        let store = layout::cluster_pki(&self.0.curator);
        let revoked = store
            .revoke_issued(&layout::owner_certificate_prefix())
            .await
            .map_err(|e| Status::unavailable(format!("revoking the owner certificates: {e}")))?;
        tracing::warn!(
            %caller,
            revoked,
            "the owner key was replaced; every earlier owner certificate is revoked"
        );
        Ok(Response::new(api::RotateOwnerResponse {
            revoked: revoked as u32,
        }))
    }

    async fn add_operator(
        &self,
        request: Request<api::AddOperatorRequest>,
    ) -> Result<Response<api::AddOperatorResponse>, Status> {
        let caller = identity(&request);
        Ok(Response::new(
            operators::add(&self.0, &caller, request.into_inner()).await?,
        ))
    }

    async fn list_operators(
        &self,
        _: Request<api::ListOperatorsRequest>,
    ) -> Result<Response<api::ListOperatorsResponse>, Status> {
        Ok(Response::new(operators::list(&self.0).await?))
    }

    async fn remove_operator(
        &self,
        request: Request<api::RemoveOperatorRequest>,
    ) -> Result<Response<api::RemoveOperatorResponse>, Status> {
        let caller = identity(&request);
        Ok(Response::new(
            operators::remove(&self.0, &caller, &request.get_ref().name).await?,
        ))
    }

    async fn rotate_ca(
        &self,
        request: Request<api::RotateCaRequest>,
    ) -> Result<Response<api::CaRotation>, Status> {
        let caller = identity(&request).to_string();
        Ok(Response::new(
            ca_rotation::rotate(&self.0, &caller, request.get_ref()).await?,
        ))
    }

    async fn get_ca_rotation(
        &self,
        request: Request<api::GetCaRotationRequest>,
    ) -> Result<Response<api::CaRotation>, Status> {
        self.0.leadership().await?;
        let which = ca_rotation::Rotated::from_request(request.get_ref().etcd_peer);
        Ok(Response::new(ca_rotation::status(&self.0, which).await?))
    }

    async fn set_snapshot_schedule(
        &self,
        request: Request<api::SetSnapshotScheduleRequest>,
    ) -> Result<Response<api::SetSnapshotScheduleResponse>, Status> {
        Ok(Response::new(
            super::scheduled_api::set_schedule(&self.0, request.get_ref()).await?,
        ))
    }

    async fn create_register_ticket(
        &self,
        request: Request<api::CreateRegisterTicketRequest>,
    ) -> Result<Response<api::CreateRegisterTicketResponse>, Status> {
        let caller = identity(&request);
        Ok(Response::new(
            tickets::create(&self.0, &caller, request.into_inner()).await?,
        ))
    }

    async fn list_register_tickets(
        &self,
        _: Request<api::ListRegisterTicketsRequest>,
    ) -> Result<Response<api::ListRegisterTicketsResponse>, Status> {
        Ok(Response::new(tickets::list(&self.0).await?))
    }

    async fn revoke_register_ticket(
        &self,
        request: Request<api::RevokeRegisterTicketRequest>,
    ) -> Result<Response<api::RevokeRegisterTicketResponse>, Status> {
        let caller = identity(&request);
        tickets::revoke(&self.0, &caller, &request.get_ref().id).await?;
        Ok(Response::new(api::RevokeRegisterTicketResponse {}))
    }
}
