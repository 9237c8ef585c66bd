//! Register tickets: the secrets new nodes present to RegisterNode, kept as cluster
//! records under `tickets/<id>` (see `layout`). A ticket has a public id and a secret
//! (32 random bytes) of which only the SHA-256 is stored; it expires and may have a use
//! count. What a node presents is `<id>.<secret as hex>` ([`format_ticket`]).
//!
//! ```text
//!   CreateRegisterTicket ──▶ create: put tickets/<id> if absent (leader write)
//!   RegisterNode ──────────▶ authorize: load, compare the secret's hash in constant time,
//!                            refuse expired / used up ──▶ Spend (spend_plan), in the
//!                            transaction that creates the node record (writes):
//!                            limited: compare the mod revision, put one use less;
//!                            unlimited: compare the create revision (not revoked),
//!                            last-used put at most once a second, nested and guarded
//!   List / Revoke / rotate ▶ list, revoke, revoke_all; prune drops tickets expired or
//!                            used up for more than PRUNE_AFTER
//! ```
//! The rules ([`check`], [`spent`], [`spend_plan`], [`prunable`]) are pure and
//! unit-tested.
//!
//! May import only `error`, `layout` and `election` (its writes are leader writes);
//! touches no node record.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use consensus::Namespaced;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use prost::Message;
use proto::state::RegisterTicket;

use crate::election::{self, Leadership};
use crate::error::CuratorError;
use crate::layout::{REGISTER_TICKET_KEY, TICKETS_PREFIX, ticket_key};

/// Length of a ticket's secret.
pub const SECRET_LEN: usize = 32;
/// Hex digits of a ticket's id.
pub const ID_LEN: usize = 8;
/// The lifetime of a ticket when none is asked for (like kubeadm's tokens).
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);
/// Tickets that may exist at once: creating more is refused until some are revoked or
/// pruned, so the records (read in one range) stay bounded.
pub const MAX_TICKETS: usize = 1000;
/// How long an expired or used-up ticket is kept (so a node presenting it hears why it
/// is refused) before it is pruned.
pub const PRUNE_AFTER: Duration = Duration::from_secs(3600);

/// Why a ticket was refused or could not be changed.
#[derive(Debug, thiserror::Error)]
pub enum TicketError {
    #[error(
        "the register ticket is malformed (parameters made by an earlier version hold a \
         ticket without an id); create new parameters with `polisctl params register`"
    )]
    Malformed,
    /// Unknown id or wrong secret: the two are not told apart.
    #[error(
        "the register ticket is wrong or was rotated or revoked; create new parameters \
         with `polisctl params register`"
    )]
    Invalid,
    #[error(
        "register ticket {0} has expired; create new parameters with `polisctl params register`"
    )]
    Expired(String),
    #[error(
        "register ticket {0} is used up; create new parameters with `polisctl params register`"
    )]
    UsedUp(String),
    #[error("register ticket {0} does not exist")]
    NotFound(String),
    #[error("{MAX_TICKETS} register tickets exist; revoke some first")]
    TooMany,
    #[error("the register ticket changed while it was being used; try again")]
    Changed,
    #[error(transparent)]
    Curator(#[from] CuratorError),
}

/// A ticket as a node presents it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Presented {
    pub id: String,
    secret: [u8; SECRET_LEN],
}

/// Seconds since the Unix epoch.
pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn valid_id(id: &str) -> bool {
    id.len() == ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Parses `<id>.<secret as hex>`.
pub fn parse_ticket(bytes: &[u8]) -> Result<Presented, TicketError> {
    let text = std::str::from_utf8(bytes).map_err(|_| TicketError::Malformed)?;
    let (id, secret) = text.split_once('.').ok_or(TicketError::Malformed)?;
    if !valid_id(id) {
        return Err(TicketError::Malformed);
    }
    let secret: [u8; SECRET_LEN] = hex::decode(secret)
        .ok()
        .and_then(|s| s.try_into().ok())
        .ok_or(TicketError::Malformed)?;
    Ok(Presented {
        id: id.to_string(),
        secret,
    })
}

/// What a node presents for the ticket `id` with `secret`.
pub fn format_ticket(id: &str, secret: &[u8]) -> Vec<u8> {
    format!("{id}.{}", hex::encode(secret)).into_bytes()
}

fn secret_hash(secret: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, secret)
        .as_ref()
        .to_vec()
}

/// Compares two byte strings in constant time (for equal lengths).
pub fn ticket_matches(stored: &[u8], presented: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    stored.len() == presented.len() && bool::from(stored.ct_eq(presented))
}

/// Whether `stored` lets a new node register at `now` with `presented`: the secret's
/// hash matches (constant time), it has not expired, and it has a use left.
pub fn check(stored: &RegisterTicket, presented: &Presented, now: u64) -> Result<(), TicketError> {
    if !ticket_matches(&stored.secret_sha256, &secret_hash(&presented.secret)) {
        return Err(TicketError::Invalid);
    }
    if stored.expires_unix != 0 && now >= stored.expires_unix {
        return Err(TicketError::Expired(stored.id.clone()));
    }
    if stored.uses_left == Some(0) {
        return Err(TicketError::UsedUp(stored.id.clone()));
    }
    Ok(())
}

/// `stored` after it let one node register at `now`.
pub fn spent(stored: &RegisterTicket, now: u64) -> RegisterTicket {
    let mut next = stored.clone();
    next.uses_left = stored.uses_left.map(|u| u.saturating_sub(1));
    next.last_used_unix = now;
    next
}

/// Whether `stored` has been expired or used up for longer than [`PRUNE_AFTER`].
pub fn prunable(stored: &RegisterTicket, now: u64) -> bool {
    let grace = PRUNE_AFTER.as_secs();
    let expired_long = stored.expires_unix != 0 && now >= stored.expires_unix + grace;
    let used_up_long = stored.uses_left == Some(0)
        && now >= stored.last_used_unix.max(stored.created_unix) + grace;
    expired_long || used_up_long
}

fn random(buf: &mut [u8]) -> Result<(), CuratorError> {
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), buf)
        .map_err(|_| CuratorError::Protocol("system random source failed"))
}

fn decode(id: &str, bytes: &[u8]) -> Result<RegisterTicket, CuratorError> {
    RegisterTicket::decode(bytes).map_err(|source| CuratorError::Corrupt {
        what: format!("register ticket {id}"),
        source,
    })
}

/// Every ticket record (pruned ones included until [`prune`] runs), with its key's mod
/// revision, in id order.
async fn list_with_revisions(
    curator: &Namespaced,
) -> Result<Vec<(RegisterTicket, i64)>, CuratorError> {
    let range =
        consensus::pages::read_prefix(&curator.client(), curator.key(TICKETS_PREFIX)).await?;
    range
        .kvs
        .iter()
        .map(|kv| {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            Ok((decode(&key, kv.value())?, kv.mod_revision()))
        })
        .collect()
}

/// Every ticket, in id order.
pub async fn list(curator: &Namespaced) -> Result<Vec<RegisterTicket>, CuratorError> {
    Ok(list_with_revisions(curator)
        .await?
        .into_iter()
        .map(|(t, _)| t)
        .collect())
}

/// Creates a ticket that expires after `ttl` (None: never) and allows `uses`
/// registrations (None: unlimited). Returns what a node presents, and the record.
pub async fn create(
    curator: &Namespaced,
    leadership: &Leadership,
    ttl: Option<Duration>,
    uses: Option<u32>,
    created_by: &str,
) -> Result<(Vec<u8>, RegisterTicket), TicketError> {
    let now = now_unix();
    prune(curator, leadership, now).await?;
    if list_with_revisions(curator).await?.len() >= MAX_TICKETS {
        return Err(TicketError::TooMany);
    }
    // An id already taken (1 in 4 billion per existing ticket): draw another.
    for _ in 0..8 {
        let mut id = [0u8; ID_LEN / 2];
        random(&mut id)?;
        let id = hex::encode(id);
        let mut secret = [0u8; SECRET_LEN];
        random(&mut secret)?;
        let record = RegisterTicket {
            id: id.clone(),
            secret_sha256: secret_hash(&secret),
            created_unix: now,
            expires_unix: ttl.map_or(0, |t| now + t.as_secs().max(1)),
            uses_left: uses,
            created_by: created_by.to_string(),
            last_used_unix: 0,
        };
        let key = curator.key(&ticket_key(&id));
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, record.encode_to_vec(), None)]);
        if election::leader_txn(curator, leadership, txn)
            .await?
            .succeeded()
        {
            return Ok((format_ticket(&id, &secret), record));
        }
    }
    Err(CuratorError::Protocol("every ticket id drawn was taken").into())
}

/// Deletes ticket `id`.
pub async fn revoke(
    curator: &Namespaced,
    leadership: &Leadership,
    id: &str,
) -> Result<(), TicketError> {
    if !valid_id(id) {
        return Err(TicketError::NotFound(proto::echo::quoted(id)));
    }
    let key = curator.key(&ticket_key(id));
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Greater, 0)])
        .and_then([TxnOp::delete(key, None)]);
    if !election::leader_txn(curator, leadership, txn)
        .await?
        .succeeded()
    {
        return Err(TicketError::NotFound(id.to_string()));
    }
    Ok(())
}

/// Deletes every ticket (and the single ticket of earlier versions); returns how many
/// there were.
pub async fn revoke_all(
    curator: &Namespaced,
    leadership: &Leadership,
) -> Result<usize, CuratorError> {
    let count = list_with_revisions(curator).await?.len();
    let txn = Txn::new().and_then([
        TxnOp::delete(
            curator.key(TICKETS_PREFIX),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        ),
        TxnOp::delete(curator.key(REGISTER_TICKET_KEY), None),
    ]);
    election::leader_txn(curator, leadership, txn).await?;
    Ok(count)
}

/// Deletes the tickets [`prunable`] at `now` (each guarded by its revision, so a ticket
/// changed meanwhile stays); returns how many.
pub async fn prune(
    curator: &Namespaced,
    leadership: &Leadership,
    now: u64,
) -> Result<usize, CuratorError> {
    let mut pruned = 0;
    for (ticket, revision) in list_with_revisions(curator).await? {
        if !prunable(&ticket, now) {
            continue;
        }
        let key = curator.key(&ticket_key(&ticket.id));
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::delete(key, None)]);
        if election::leader_txn(curator, leadership, txn)
            .await?
            .succeeded()
        {
            tracing::info!(
                ticket = ticket.id,
                "pruned an expired or used-up register ticket"
            );
            pruned += 1;
        }
    }
    Ok(pruned)
}

/// How a registration spends a ticket, decided on the stored ticket at `now`.
#[derive(Debug, Clone, PartialEq)]
pub enum SpendPlan {
    /// A limited ticket: the ticket with one use less, written in the creating
    /// transaction guarded by the ticket's mod revision (exact: concurrent
    /// registrations on it serialize, none overspends).
    Exact(RegisterTicket),
    /// An unlimited ticket: the creating transaction only checks that it still exists
    /// (its create revision), so registrations on it do not conflict. Its last-used
    /// time is written when it is not already `now` (at most about once a second),
    /// in a nested transaction guarded by the revision it was read at: a registration
    /// that lost that race still registers, and the time never moves backwards.
    Unlimited(Option<RegisterTicket>),
}

/// How a registration at `now` spends `stored` (see [`SpendPlan`]).
pub fn spend_plan(stored: &RegisterTicket, now: u64) -> SpendPlan {
    match stored.uses_left {
        Some(_) => SpendPlan::Exact(spent(stored, now)),
        None if stored.last_used_unix == now => SpendPlan::Unlimited(None),
        None => SpendPlan::Unlimited(Some(spent(stored, now))),
    }
}

/// One use of a ticket, to be made in the transaction that creates a node record: the
/// comparisons (the ticket as it was checked) and the writes (see [`SpendPlan`]).
pub struct Spend {
    pub id: String,
    /// A limited ticket: registrations on it conflict (better made one at a time).
    pub exact: bool,
    pub compares: Vec<Compare>,
    pub ops: Vec<TxnOp>,
}

/// Checks `presented` (see [`check`]) against the stored ticket; the [`Spend`] to make
/// with the registration. A ticket refused as expired or used up is pruned when due.
pub async fn authorize(
    curator: &Namespaced,
    leadership: &Leadership,
    presented: &[u8],
) -> Result<Spend, TicketError> {
    let presented = parse_ticket(presented)?;
    let key = curator.key(&ticket_key(&presented.id));
    let response = curator
        .kv()
        .get(key.clone(), None)
        .await
        .map_err(CuratorError::from)?;
    let Some(kv) = response.kvs().first() else {
        return Err(TicketError::Invalid);
    };
    let stored = decode(&presented.id, kv.value())?;
    let now = now_unix();
    if let Err(e) = check(&stored, &presented, now) {
        if matches!(e, TicketError::Expired(_) | TicketError::UsedUp(_)) {
            prune(curator, leadership, now).await?;
        }
        return Err(e);
    }
    let read_at = Compare::mod_revision(key.clone(), CompareOp::Equal, kv.mod_revision());
    let (exact, compares, ops) = match spend_plan(&stored, now) {
        SpendPlan::Exact(next) => (
            true,
            vec![read_at],
            vec![TxnOp::put(key, next.encode_to_vec(), None)],
        ),
        SpendPlan::Unlimited(next) => (
            false,
            vec![Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                kv.create_revision(),
            )],
            next.map(|next| {
                TxnOp::txn(Txn::new().when([read_at]).and_then([TxnOp::put(
                    key,
                    next.encode_to_vec(),
                    None,
                )]))
            })
            .into_iter()
            .collect(),
        ),
    };
    Ok(Spend {
        id: stored.id.clone(),
        exact,
        compares,
        ops,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(secret: &[u8], expires: u64, uses: Option<u32>) -> RegisterTicket {
        RegisterTicket {
            id: "0a1b2c3d".into(),
            secret_sha256: secret_hash(secret),
            created_unix: 100,
            expires_unix: expires,
            uses_left: uses,
            created_by: "user owner".into(),
            last_used_unix: 0,
        }
    }

    fn presented(secret: [u8; SECRET_LEN]) -> Presented {
        parse_ticket(&format_ticket("0a1b2c3d", &secret)).unwrap()
    }

    #[test]
    fn tickets_compare_exactly() {
        let t = [7u8; SECRET_LEN];
        assert!(ticket_matches(&t, &t));
        let mut other = t;
        other[31] ^= 1;
        assert!(!ticket_matches(&t, &other));
        assert!(!ticket_matches(&t, &t[..31]));
        assert!(!ticket_matches(&t, &[]));
    }

    #[test]
    fn presented_tickets_parse_strictly() {
        let p = presented([9; SECRET_LEN]);
        assert_eq!(p.id, "0a1b2c3d");
        assert_eq!(p.secret, [9; SECRET_LEN]);
        for bad in [
            &b""[..],
            &[7u8; 32][..],
            b"0a1b2c3d",
            b"0A1B2C3D.00",
            b"0a1b2c3.0000000000000000000000000000000000000000000000000000000000000000",
            b"0a1b2c3d.000000000000000000000000000000000000000000000000000000000000000",
            b"0a1b2c3d.zz00000000000000000000000000000000000000000000000000000000000000",
        ] {
            assert!(
                matches!(parse_ticket(bad), Err(TicketError::Malformed)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_ticket_lets_nodes_register_until_it_expires_or_is_used_up() {
        let secret = [1; SECRET_LEN];
        let good = presented(secret);
        assert!(check(&ticket(&secret, 200, Some(1)), &good, 199).is_ok());
        assert!(check(&ticket(&secret, 0, None), &good, u64::MAX).is_ok());
        assert!(matches!(
            check(&ticket(&secret, 200, None), &good, 200),
            Err(TicketError::Expired(id)) if id == "0a1b2c3d"
        ));
        assert!(matches!(
            check(&ticket(&secret, 0, Some(0)), &good, 150),
            Err(TicketError::UsedUp(_))
        ));
        // A wrong secret is refused before anything about the ticket is told.
        assert!(matches!(
            check(
                &ticket(&secret, 200, Some(0)),
                &presented([2; SECRET_LEN]),
                300
            ),
            Err(TicketError::Invalid)
        ));
    }

    #[test]
    fn spending_counts_down_limited_uses_only() {
        let t = ticket(&[1; SECRET_LEN], 0, Some(2));
        let once = spent(&t, 150);
        assert_eq!(once.uses_left, Some(1));
        assert_eq!(once.last_used_unix, 150);
        assert_eq!(spent(&once, 151).uses_left, Some(0));
        assert_eq!(spent(&ticket(&[1; 32], 0, None), 150).uses_left, None);
    }

    #[test]
    fn limited_tickets_are_spent_exactly_unlimited_ones_note_their_use_once_a_second() {
        let limited = ticket(&[1; SECRET_LEN], 0, Some(2));
        assert_eq!(
            spend_plan(&limited, 150),
            SpendPlan::Exact(spent(&limited, 150))
        );
        let mut open = ticket(&[1; SECRET_LEN], 0, None);
        assert_eq!(
            spend_plan(&open, 150),
            SpendPlan::Unlimited(Some(spent(&open, 150)))
        );
        open.last_used_unix = 150;
        assert_eq!(spend_plan(&open, 150), SpendPlan::Unlimited(None));
        assert_eq!(
            spend_plan(&open, 151),
            SpendPlan::Unlimited(Some(spent(&open, 151)))
        );
        // Limited tickets are written on every use, within one second too.
        let mut used = limited.clone();
        used.last_used_unix = 150;
        assert_eq!(spend_plan(&used, 150), SpendPlan::Exact(spent(&used, 150)));
    }

    #[test]
    fn tickets_are_pruned_an_hour_after_they_stop_working() {
        let grace = PRUNE_AFTER.as_secs();
        let expiring = ticket(&[1; SECRET_LEN], 200, None);
        assert!(!prunable(&expiring, 200));
        assert!(!prunable(&expiring, 200 + grace - 1));
        assert!(prunable(&expiring, 200 + grace));
        let mut used = ticket(&[1; SECRET_LEN], 0, Some(0));
        used.last_used_unix = 300;
        assert!(!prunable(&used, 300 + grace - 1));
        assert!(prunable(&used, 300 + grace));
        assert!(!prunable(
            &ticket(&[1; SECRET_LEN], 0, Some(3)),
            u64::MAX / 2
        ));
    }
}

/// Properties over arbitrary presented tickets (proptest): a register ticket comes from
/// a node that has not been admitted yet.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn tickets_round_trip(id in "[0-9a-f]{8}", secret in any::<[u8; SECRET_LEN]>()) {
            let presented = parse_ticket(&format_ticket(&id, &secret)).unwrap();
            prop_assert_eq!(presented.id, id);
            prop_assert_eq!(presented.secret, secret);
        }

        #[test]
        fn anything_else_is_malformed(
            bytes in prop_oneof![
                prop::collection::vec(any::<u8>(), 0..100),
                "[0-9a-fA-F]{7,9}\\.[0-9a-fA-F]{62,66}".prop_map(String::into_bytes),
            ],
        ) {
            if let Ok(presented) = parse_ticket(&bytes) {
                prop_assert_eq!(format_ticket(&presented.id, &presented.secret).to_ascii_lowercase(), bytes.to_ascii_lowercase());
            }
        }
    }
}
