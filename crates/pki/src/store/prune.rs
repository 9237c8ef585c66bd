//! Forgetting certificates long expired and superseded, so that a store does not grow
//! with every renewal and every CA rotation (nor does every listing of it): the newest
//! of each kind and subject stays, however old; each record goes with its serial's
//! record, in one transaction, only if it is still the certificate listed.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::CaStore;
use crate::PkiError;

/// A recorded certificate as pruning judges it.
struct Recorded<'a> {
    name: &'a str,
    der: &'a [u8],
    /// Its kind's mark and its subject's common name.
    subject: (&'static str, String),
    validity: crate::Validity,
    serial: Vec<u8>,
}

impl<'a> Recorded<'a> {
    fn parse(name: &'a str, der: &'a [u8]) -> Option<Recorded<'a>> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let common_name = crate::common_name(cert.subject());
        let kind = crate::CertificateKind::of(&cert).map_or("", |k| k.mark());
        Some(Recorded {
            name,
            der,
            subject: (kind, common_name),
            validity: crate::Validity::of(der).ok()?,
            serial: cert.raw_serial().to_vec(),
        })
    }
}

/// Of `listed` (name, DER), the certificates [`CaStore::prune_superseded`] forgets at
/// `now`, as (name, DER, serial): expired more than `keep_after_expiry` ago and not the
/// newest (latest start of validity) of their kind and subject name. A certificate that
/// does not parse is kept. Pure.
fn superseded(
    listed: &[(String, Vec<u8>)],
    now: u64,
    keep_after_expiry: Duration,
) -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let parsed: Vec<Recorded> = listed
        .iter()
        .filter_map(|(name, der)| Recorded::parse(name, der))
        .collect();
    let mut newest: std::collections::HashMap<&(&str, String), (u64, &str)> = Default::default();
    for r in &parsed {
        let entry = newest
            .entry(&r.subject)
            .or_insert((r.validity.not_before, r.name));
        if (r.validity.not_before, r.name) > *entry {
            *entry = (r.validity.not_before, r.name);
        }
    }
    parsed
        .iter()
        .filter(|r| {
            newest.get(&r.subject).is_some_and(|(_, n)| *n != r.name)
                && r.validity
                    .not_after
                    .saturating_add(keep_after_expiry.as_secs())
                    < now
        })
        .map(|r| (r.name.to_string(), r.der.to_vec(), r.serial.clone()))
        .collect()
}

impl CaStore {
    /// Forgets the certificates that expired more than `keep_after_expiry` before `now`
    /// (Unix seconds) and were superseded: a newer one of the same kind for the same
    /// subject name is recorded. Without this the store grows with every renewal and
    /// every CA rotation, and every listing with it. The newest of each subject stays
    /// whatever its age (`cluster certificates` shows a node that stopped renewing).
    /// Each goes in one transaction with its serial's record, only if it is still the
    /// certificate listed. Returns how many went.
    pub async fn prune_superseded(
        &self,
        now: u64,
        keep_after_expiry: Duration,
    ) -> Result<usize, PkiError> {
        let listed = self.list_issued("").await?;
        let mut pruned = 0;
        for (name, der, serial) in superseded(&listed, now, keep_after_expiry) {
            let cert_key = self.ns.key(&format!("issued/{name}"));
            let serial_key = self.ns.key(&format!("serials/{}", hex::encode(&serial)));
            let txn = Txn::new()
                .when([Compare::value(cert_key.clone(), CompareOp::Equal, der)])
                .and_then([
                    TxnOp::delete(cert_key, None),
                    TxnOp::delete(serial_key, None),
                ]);
            if self.ns.client().txn(txn).await?.succeeded() {
                pruned += 1;
            }
        }
        Ok(pruned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Ca;

    #[test]
    fn only_certificates_long_expired_and_superseded_are_pruned() {
        let ca = Ca::generate("ca", crate::CA_LIFETIME).unwrap();
        let key = [7u8; 32];
        let template = |cn: &str, kind| crate::Template {
            common_name: cn.into(),
            dns_names: vec![],
            ip_addresses: vec![],
            usage: crate::Usage::Client,
            lifetime: Duration::from_secs(3600),
            kind,
        };
        let at = |cn: &str, kind, t: i64| {
            let issued = time::OffsetDateTime::from_unix_timestamp(t).unwrap();
            ca.issue_at(&template(cn, kind), &key, issued).unwrap().der
        };
        let node = crate::CertificateKind::Node;
        let listed = vec![
            ("node-a-1".to_string(), at("a", node, 1_000_000)),
            ("node-a-2".to_string(), at("a", node, 1_002_000)),
            ("node-a-3".to_string(), at("a", node, 1_004_000)),
            // Another subject, and another kind for the same subject: their own newest.
            ("node-b-1".to_string(), at("b", node, 1_000_000)),
            (
                "curator-a-1".to_string(),
                at("a", crate::CertificateKind::Curator, 1_000_000),
            ),
            ("junk".to_string(), vec![1, 2, 3]),
        ];
        let names = |now: u64, keep: u64| -> Vec<String> {
            superseded(&listed, now, Duration::from_secs(keep))
                .into_iter()
                .map(|(name, _, _)| name)
                .collect()
        };
        // node-a-1 ends at 1_003_600, node-a-2 at 1_005_600.
        assert!(names(1_003_600, 0).is_empty());
        assert_eq!(names(1_003_601, 0), vec!["node-a-1"]);
        assert_eq!(names(1_005_601, 0), vec!["node-a-1", "node-a-2"]);
        // Kept for as long as asked after expiry.
        assert_eq!(names(1_005_601, 2000), vec!["node-a-1"]);
        // The newest of each subject stays, however old.
        assert_eq!(names(u64::MAX / 2, 0), vec!["node-a-1", "node-a-2"]);
    }
}
