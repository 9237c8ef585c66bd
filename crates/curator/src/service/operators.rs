//! Operators, for the handlers: Management's AddOperator, ListOperators and
//! RemoveOperator, and the certificate AAA.Escrow issues for an operator's key.
//!
//! ```text
//!   AddOperator    checked (name, role, key) ─▶ certificates an earlier operator of the
//!                  name kept revoked ─▶ operators::add (one guarded transaction)
//!   RemoveOperator operators::remove (the record first) ─▶ its certificates revoked
//!                  (again: finishes a revocation an earlier removal could not)
//!   ListOperators  the unrevoked operator certificates, then the records: names with
//!                  certificates but no record are unfinished removals
//!   Escrow         the newest certificate for the key while renewing is not due, else
//!                  a new one, recorded as operator-<name>.<serial> while the record
//!                  stays as checked (a removal racing it leaves nothing valid)
//! ```
//! Imports only `issuance`, `status` and `shared` of the service, and the crate's
//! `operators`, `layout` and `templates`.

use proto::api;
use proto::state::Operator;
use tonic::Status;

use super::issuance;
use super::shared::Shared;
use super::status::status_from;
use crate::operators::{self, OperatorError};
use crate::{layout, templates};

fn operator_status(e: OperatorError) -> Status {
    match e {
        OperatorError::Exists(_) | OperatorError::KeyTaken(_) | OperatorError::OwnersKey => {
            Status::already_exists(e.to_string())
        }
        OperatorError::TooMany => Status::resource_exhausted(e.to_string()),
        OperatorError::Changed => Status::aborted(e.to_string()),
        OperatorError::Curator(c) => status_from(c),
    }
}

fn info(o: Operator) -> api::OperatorInfo {
    api::OperatorInfo {
        name: o.name,
        role: o.role,
        public_key: o.public_key,
        added_unix: o.added_unix,
        added_by: o.added_by,
    }
}

fn check_name(name: &str) -> Result<(), Status> {
    proto::operators::validate_name(name).map_err(|e| Status::invalid_argument(e.to_string()))
}

fn unavailable(what: &str, e: pki::PkiError) -> Status {
    Status::unavailable(format!("{what}: {e}"))
}

/// Every certificate recorded under `prefix` that has neither expired nor been revoked
/// yet: its name and serial. The certificates are read before the CRL.
async fn unrevoked(store: &pki::CaStore, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, Status> {
    let issued = store
        .list_issued(prefix)
        .await
        .map_err(|e| unavailable("listing operator certificates", e))?;
    let revoked = match store.crl().await {
        Ok(crl) => pki::crl_serials(&crl).map_err(|e| unavailable("reading the CRL", e))?,
        Err(e) => return Err(unavailable("reading the CRL", e)),
    };
    let mut left = Vec::new();
    for (name, der) in issued {
        let live = pki::time_to_expiry(&der).map_err(|e| unavailable(&name, e))?;
        let serial = pki::certificate_serial(&der).map_err(|e| unavailable(&name, e))?;
        if live.is_some() && !revoked.contains(&serial) {
            left.push((name, serial));
        }
    }
    Ok(left)
}

/// Revokes every certificate recorded under `prefix` that has neither expired nor
/// been revoked yet; how many that were.
async fn revoke_unrevoked(shared: &Shared, prefix: &str) -> Result<usize, Status> {
    let (store, _) = issuance::cluster_ca(shared).await?;
    let left = unrevoked(&store, prefix).await?;
    for (_, serial) in &left {
        store
            .revoke(serial)
            .await
            .map_err(|e| unavailable("revoking an operator certificate", e))?;
    }
    Ok(left.len())
}

/// AddOperator.
pub(super) async fn add(
    shared: &Shared,
    caller: &rpc::Identity,
    r: api::AddOperatorRequest,
) -> Result<api::AddOperatorResponse, Status> {
    check_name(&r.name)?;
    let role = pki::OperatorRole::from_name(&r.role).ok_or_else(|| {
        Status::invalid_argument(format!(
            "unknown role {}: want reader, operator or admin",
            proto::echo::quoted(&r.role)
        ))
    })?;
    if r.public_key.len() != 32 {
        return Err(Status::invalid_argument(format!(
            "the operator's key must be 32 bytes (Ed25519), not {}",
            r.public_key.len()
        )));
    }
    let leadership = shared.leadership().await?;
    // Refused before anything is revoked: the certificates under the name are the
    // current operator's.
    let (existing, _) = operators::list(&shared.curator)
        .await
        .map_err(status_from)?;
    if existing.iter().any(|o| o.name == r.name) {
        return Err(operator_status(OperatorError::Exists(r.name)));
    }
    // An earlier operator of this name may have kept certificates a failed removal did
    // not revoke: they would name the new operator. (An addition of the same name
    // racing this one loses its first certificate at worst; `operators::add` lets only
    // one of them record the name.)
    let revoked = revoke_unrevoked(shared, &layout::operator_certificate_prefix(&r.name)).await?;
    let operator = Operator {
        name: r.name,
        public_key: r.public_key,
        role: role.name().to_string(),
        added_unix: pki::unix_now(),
        added_by: caller.to_string(),
    };
    operators::add(&shared.curator, &leadership, &operator)
        .await
        .map_err(operator_status)?;
    tracing::info!(name = operator.name, %role, %caller, "added an operator");
    Ok(api::AddOperatorResponse {
        revoked: revoked as u32,
    })
}

/// ListOperators: the records, and the names whose removal left certificates
/// unrevoked. The certificates are read before the records: a certificate recorded
/// meanwhile is an operator's whose record was there first (Escrow records under it),
/// so no operator being added shows as a removal; a removal finishing meanwhile may
/// show as unfinished once.
pub(super) async fn list(shared: &Shared) -> Result<api::ListOperatorsResponse, Status> {
    shared.leadership().await?;
    let store = layout::cluster_pki(&shared.curator);
    let left = unrevoked(&store, layout::OPERATOR_CERTIFICATES_PREFIX).await?;
    let (operators, _) = operators::list(&shared.curator)
        .await
        .map_err(status_from)?;
    let unfinished =
        operators::unfinished_removals(&operators, left.iter().map(|(n, _)| n.as_str()));
    Ok(api::ListOperatorsResponse {
        operators: operators.into_iter().map(info).collect(),
        unfinished_removals: unfinished
            .into_iter()
            .map(|(name, unrevoked)| api::UnfinishedRemoval { name, unrevoked })
            .collect(),
    })
}

/// RemoveOperator: the record first, then every certificate of the name revoked. A name
/// without a record is refused unless certificates of it were still to revoke.
pub(super) async fn remove(
    shared: &Shared,
    caller: &rpc::Identity,
    name: &str,
) -> Result<api::RemoveOperatorResponse, Status> {
    check_name(name)?;
    let leadership = shared.leadership().await?;
    let existed = operators::remove(&shared.curator, &leadership, name)
        .await
        .map_err(status_from)?;
    // Test builds: hold the state a failed revocation leaves (the record gone, the
    // certificates valid) for ListOperators to show (fenced_issuing test).
    crate::pause::pause_point("operator-record-deleted", name).await;
    let revoked = revoke_unrevoked(shared, &layout::operator_certificate_prefix(name)).await?;
    if !existed && revoked == 0 {
        // Also the answer to a retry of a removal that did finish: say that nothing of
        // the name is left, so an admin in an incident need not wonder.
        return Err(Status::not_found(format!(
            "no operator is named {name:?}, and no certificate of that name is left \
             unrevoked"
        )));
    }
    tracing::warn!(
        name,
        revoked,
        existed,
        %caller,
        "removed an operator; its certificates are revoked"
    );
    Ok(api::RemoveOperatorResponse {
        revoked: revoked as u32,
    })
}

/// Escrow for an operator's key (`operator`, its record read under `guard`): the
/// newest unrevoked certificate for the key while renewing it is not due, else a new
/// one recorded as `operator-<name>.<serial>` while `guard` holds. Returns it and the
/// cluster CA (DER).
pub(super) async fn escrow(
    shared: &Shared,
    operator: &Operator,
    subject: &[u8; 32],
    guard: etcd_client::Compare,
) -> Result<(Vec<u8>, Vec<u8>), Status> {
    let role = pki::OperatorRole::from_name(&operator.role).ok_or_else(|| {
        Status::internal(format!(
            "operator {:?} has an unknown role {:?}",
            operator.name, operator.role
        ))
    })?;
    let lifetime =
        templates::owner_certificate_lifetime(Some(&issuance::configuration(shared).await?));
    let (store, ca) = issuance::cluster_ca(shared).await?;
    let prefix = layout::operator_certificate_prefix(&operator.name);
    if let Some(newest) = not_yet_due(&store, &prefix, subject, role, &ca.cert_der).await? {
        return Ok((newest, ca.cert_der));
    }
    let template = templates::operator_certificate_template(&operator.name, role, lifetime);
    let issued = ca
        .issue(&template, subject)
        .map_err(|e| Status::internal(format!("issuing the operator certificate: {e}")))?;
    // Test builds: widen the window between the record's check and the recording
    // (fenced_issuing test: a removal inside it).
    crate::pause::pause_point("operator-certificate-signed", &operator.name).await;
    let name = layout::operator_certificate_name(&operator.name, &issued.serial);
    let certificate = store
        .ensure_certificate_guarded(&name, vec![guard], || Ok(issued.clone()))
        .await
        .map_err(|e| match e {
            pki::PkiError::Fenced(_) => Status::aborted(format!(
                "operator {:?} was removed or replaced while its certificate was issued; \
                 nothing was recorded",
                operator.name
            )),
            e => Status::unavailable(format!("recording the operator certificate: {e}")),
        })?;
    shared.certificates_changed.notify_one();
    tracing::info!(
        operator = operator.name,
        %role,
        serial = hex::encode(&issued.serial),
        "issued an operator certificate"
    );
    Ok((certificate, ca.cert_der))
}

/// The newest certificate under `prefix` for `subject` and `role`, unrevoked, while
/// renewing it is not due: asking again returns it, so no caller can fill etcd (nor
/// make its own removal's revocation long) by escrowing in a loop. One the signing CA
/// did not issue (a CA rotation replaced it) is due at once.
async fn not_yet_due(
    store: &pki::CaStore,
    prefix: &str,
    subject: &[u8; 32],
    role: pki::OperatorRole,
    signing: &[u8],
) -> Result<Option<Vec<u8>>, Status> {
    let unavailable =
        |e: pki::PkiError| Status::unavailable(format!("listing the operator's certificates: {e}"));
    let issued = store.list_issued(prefix).await.map_err(unavailable)?;
    if issued.is_empty() {
        return Ok(None);
    }
    let revoked =
        pki::crl_serials(&store.crl().await.map_err(unavailable)?).map_err(unavailable)?;
    let now = pki::unix_now();
    let newest = issued
        .into_iter()
        .filter_map(|(_, der)| {
            let validity = pki::Validity::of(&der).ok()?;
            let key = pki::certificate_public_key(&der).ok()?;
            let serial = pki::certificate_serial(&der).ok()?;
            let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
            let same = operators::same_key(&key, subject)
                && pki::issued_by(&der, signing)
                && pki::CertificateKind::of(&cert) == Some(pki::CertificateKind::Operator(role))
                && !revoked.contains(&serial);
            drop(cert);
            same.then_some((der, validity))
        })
        .max_by_key(|(_, v)| v.issued());
    Ok(newest
        .filter(|(_, validity)| !issuance::renewal_due(validity, now))
        .map(|(der, _)| der))
}
