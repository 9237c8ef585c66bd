//! Cluster PKI: certificate authorities, certificates and revocation lists, kept in etcd.
//!
//! Polis has two CAs, both Ed25519 and both stored in etcd under their consensus user's
//! namespace:
//! - the **cluster CA** (`namespaced:curator/cluster-pki/`) issues node certificates and
//!   owner/user certificates; the curator's gRPC servers trust only it;
//! - the **etcd peer CA** (`namespaced:etcd-pki/`) issues the certificates etcd members
//!   use to talk to each other.
//!
//! Modules, by layer (each imports only from those below it):
//!
//! ```text
//!   store      CaStore: etcd transactions (ensure, revoke, reissue_crl, list, watch_crl);
//!     │        store::rotation: a CA replaced in use (introduce, promote, retire,
//!     │        watch_trusted: TrustedCas, RotationPhase)
//!     ▼
//!   issue      Ca: generate, issue, CRLs; Template, Usage, Issued, serials (pure: rcgen)
//!     │
//!     ▼
//!   lifetime   defaults, bounds, BACKDATE, Validity (2/3 renew, 5/6 warn)   (pure)
//!   kind       CertificateKind: the polis:<kind> mark                       (pure)
//!   inspect    reading DER: public key, expiry, verified CRL number, serials (pure)
//! ```
//!
//! ```text
//!   issue.rs (pure: rcgen)            store.rs (etcd transactions)
//!   Ca::generate ─┐                   ensure_ca ── create if absent, else load
//!   Ca::issue ────┼──▶ Issued{der} ──▶ ensure_certificate ── create if absent, else load
//!   Ca::crl ──────┘                   revoke ── CAS update of the CRL
//!                                     watch_crl ── the CRL, then every change (one watch)
//! ```
//!
//! Invariants:
//! - *Ensure* operations are single etcd transactions: when two callers race, exactly one
//!   creates and both end up with the same object.
//! - Every certificate has a random serial number (not derived from the key, so re-issues
//!   for the same key differ), recorded under `serials/` when stored; etcd's CRL check
//!   compares serials only, so they must be unique across CAs.
//! - Every certificate has a finite lifetime between `MIN_CERTIFICATE_LIFETIME` (5 s, for
//!   tests) and `MAX_CERTIFICATE_LIFETIME`, and is valid for all of it from the moment it
//!   is issued (the clock-skew allowance, `BACKDATE`, lies before the issue time, outside
//!   the lifetime). Holders renew at 2/3 of it (`Validity::renew_at`); a certificate not
//!   replaced by 5/6 of it is worth a warning (`Validity::warn_at`).
//! - Renewal never revokes: a certificate stays recorded under its name (renewals get new
//!   names with the same prefix, e.g. `node-<id>-<serial>`) and valid until it expires.
//! - Every certificate the CAs issue carries its kind (`CertificateKind`: node, owner,
//!   etcd peer, curator) as the subject's organizational unit `polis:<kind>`; what a certificate
//!   may do is decided from that mark, never from its common name alone.
//! - A CA always has a CRL (possibly empty), created together with it.
//! - A store trusts one CA, or two while its CA is rotated (`store::rotation`); only the
//!   current one signs, and its CRL lists every revocation of the store.

mod handover;
mod inspect;
mod issue;
mod kind;
mod lifetime;
mod store;

pub use handover::{MAX_HANDOVERS, handed_over};
pub use inspect::{
    certificate_public_key, common_name, crl_serials, issued_by, signed_by, time_to_expiry,
    verified_crl_number,
};
pub use issue::{Ca, Issued, Template, Usage, random_serial};
pub use kind::{CertificateKind, OperatorRole};
pub use lifetime::{
    BACKDATE, CA_LIFETIME, CERTIFICATE_LIFETIME, MAX_CERTIFICATE_LIFETIME,
    MIN_CERTIFICATE_LIFETIME, OWNER_CERTIFICATE_LIFETIME, Validity, check_lifetime, unix_now,
};
pub use store::{CaStore, NewRecord, RotationPhase, TrustedCa, TrustedCas, certificate_serial};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("generating certificate material")]
    Generate(#[from] rcgen::Error),
    #[error("invalid {what}: {reason}")]
    Invalid { what: &'static str, reason: String },
    #[error("etcd operation on the PKI store failed")]
    Consensus(#[from] consensus::ConsensusError),
    #[error("etcd transaction on the PKI store failed")]
    Etcd(#[from] etcd_client::Error),
    #[error("certificate lifetime {lifetime:?} is too short: it must be at least {minimum:?}")]
    LifetimeTooShort {
        lifetime: std::time::Duration,
        minimum: std::time::Duration,
    },
    #[error("certificate lifetime {lifetime:?} is too long: it must be at most {maximum:?}")]
    LifetimeTooLong {
        lifetime: std::time::Duration,
        maximum: std::time::Duration,
    },
    #[error("PKI store is inconsistent: {0}")]
    Inconsistent(String),
    #[error("{0}")]
    Fenced(String),
}
