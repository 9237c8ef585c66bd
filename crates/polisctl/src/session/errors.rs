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

/// One-line description of a failed call through the curator client.
pub(crate) fn call_failure(what: &str, failure: rpc::CallError) -> anyhow::Error {
    match failure {
        rpc::CallError::Unreachable(_) if failure.revoked_server() => anyhow!(
            "{what}: {failure}; a revoked certificate belongs to a node removed from the cluster: \
             name the cluster's current curators with --endpoints"
        ),
        rpc::CallError::Unreachable(_) if failure.all_untrusted() => anyhow!(
            "{what}: {failure}; the pinned CA is not this cluster's (another cluster at these endpoints?)"
        ),
        rpc::CallError::Unreachable(_) => anyhow!("{what}: {failure}"),
        rpc::CallError::Status(s) => call_error(what, s),
    }
}
