//! One-line descriptions of failed curator calls (pure: maps errors to messages).
//! May not talk to the cluster or touch files.

use anyhow::anyhow;

/// One-line description of a failed call.
pub(crate) fn call_error(what: &str, status: tonic::Status) -> anyhow::Error {
    use tonic::Code;
    let kind = match status.code() {
        Code::PermissionDenied => "permission denied",
        Code::Unauthenticated => "not authenticated",
        Code::NotFound => "not found",
        Code::InvalidArgument => "invalid argument",
        Code::Unavailable => "unavailable",
        Code::DeadlineExceeded => "timed out",
        Code::ResourceExhausted => "refused (resource exhausted)",
        _ => "failed",
    };
    anyhow!("{what}: {kind}: {}", status.message())
}

/// Why every curator refused the pinned CA, and what to do: the operator cannot tell
/// from here whether these are another cluster's curators or this cluster's after a CA
/// rotation this configuration missed (nothing the curators present proves the latter).
const PINNED_CA_UNKNOWN: &str = "the curators' certificates do not chain to the pinned CA \
     (ca.pem of the configuration directory): these endpoints are another cluster's, or \
     this cluster's CA was rotated while this configuration was not used; then remove ca.pem \
     and crl.pem from the configuration directory and run `polisctl takeownership \
     --ca-fingerprint HEX` with the fingerprint `polisctl cluster ca` shows on a current \
     configuration";

/// A call that failed because no curator's certificate chains to the pinned CA (see
/// [`PINNED_CA_UNKNOWN`]): `main` then looks for a handover to follow.
#[derive(Debug)]
pub(crate) struct PinnedCaUnknown(String);

impl std::fmt::Display for PinnedCaUnknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PinnedCaUnknown {}

/// Whether `e` (or what it wraps) is a [`PinnedCaUnknown`].
pub(crate) fn pinned_ca_unknown(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| cause.is::<PinnedCaUnknown>())
}

/// One-line description of a failed call through the curator client.
pub(crate) fn call_failure(what: &str, failure: rpc::CallError) -> anyhow::Error {
    match failure {
        rpc::CallError::Unreachable(_) if failure.revoked_server() => anyhow!(
            "{what}: {failure}; a revoked certificate belongs to a node removed from the cluster: \
             name the cluster's current curators with --endpoints"
        ),
        rpc::CallError::Unreachable(_) if failure.all_untrusted() => anyhow::Error::new(
            PinnedCaUnknown(format!("{what}: {failure}; {PINNED_CA_UNKNOWN}")),
        ),
        rpc::CallError::Unreachable(_) => anyhow!("{what}: {failure}"),
        rpc::CallError::Status(s) => call_error(what, s),
    }
}
