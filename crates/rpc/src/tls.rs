//! TLS configuration: the curator's server side, clients, and client classification.
//!
//! Modules, by layer (each imports only from those below it):
//!
//! ```text
//!   server_side   server_config(): TLS 1.3, h2, any client cert (deferred)
//!   client_side   client_config(), ServerTrust: pinned CA | cluster CA + CRL | first use;
//!                 under a CA the server must present a curator certificate
//!      │   │
//!      │   └──▶ crl_slot     CrlSlot: newest CA-signed CRL a client has seen
//!      ▼
//!   credentials   Credentials, CredentialSlot (replaced on renewal), self_signed()
//!      │
//!      ▼
//!   crypto        provider() (ring only), proof-of-possession checks   (leaf)
//!
//!   authenticator Authenticator: classify a client certificate (CA, expiry, CRL, kind
//!                 mark), remembered per CRL; uses crypto only
//! ```

mod authenticator;
mod client_side;
mod credentials;
mod crl_slot;
mod crypto;
mod server_side;

pub use authenticator::Authenticator;
pub use client_side::{ServerTrust, client_config, client_config_from};
pub(crate) use client_side::{not_a_curator, not_the_node};
pub use credentials::{CredentialSlot, Credentials, self_signed};
pub use crl_slot::CrlSlot;
pub use crypto::provider;
pub use server_side::{server_config, server_config_from};

#[cfg(test)]
mod tests;
