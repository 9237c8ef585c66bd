//! TLS configuration: the curator's server side, clients, and client classification.
//!
//! Modules, by layer (each imports only from those below it):
//!
//! ```text
//!   server_side   server_config(): TLS 1.3, h2, any client cert (deferred)
//!   client_side   client_config(), ServerTrust: pinned CA | cluster CAs + CRLs | first
//!                 use; under a CA the server must present a curator certificate
//!      │   │
//!      │   └──▶ trust_slot   Anchors (CAs + their CRLs), TrustSlot: the CAs a client
//!      │                     trusts and the newest CA-signed CRL of each
//!      ▼
//!   credentials   Credentials, CredentialSlot (replaced on renewal), self_signed()
//!      │
//!      ▼
//!   crypto        provider() (ring only), proof-of-possession checks   (leaf)
//!
//!   authenticator Authenticator: classify a client certificate (CAs, expiry, CRLs, kind
//!                 mark), remembered per Anchors; uses crypto and trust_slot's Anchors
//! ```

mod authenticator;
mod client_side;
mod credentials;
mod crypto;
mod server_side;
mod trust_slot;

pub use authenticator::Authenticator;
pub use client_side::{ServerTrust, client_config, client_config_from};
pub(crate) use client_side::{not_a_curator, not_the_node};
pub use credentials::{CredentialSlot, Credentials, self_signed};
pub use crypto::provider;
pub use server_side::{server_config, server_config_from};
pub use trust_slot::{Anchors, MAX_TRUSTED_CAS, TrustSlot};

#[cfg(test)]
mod tests;
