//! Talking to the curators: the client with the node certificate and the cluster CRL it
//! checks curators against (`curator_client`), that CRL before the client can run
//! (`crlfetch`), the CA's handovers after a rotation missed (`handover`), and how every
//! caller retries and says so (`retry`).
//!
//! ```text
//!   curator_client  client with the node certificate; cluster CRL intake and saving
//!     └──▶ crlfetch     the CRL while registering or locked: parameters, ESP copy,
//!                       every curator known
//!   handover        the CA's handovers asked for (unverified) and followed (pure rule)
//!   retry           Backoff, ProblemLog, pause, call_until_answered
//! ```

pub(crate) mod crlfetch;
pub(crate) mod curator_client;
pub(crate) mod handover;
pub(crate) mod retry;
