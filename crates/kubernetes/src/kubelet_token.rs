//! A kubelet's credential towards the apiservers (pure): `<node id>.<secret as hex>`.
//!
//! The apiserver cannot revoke a client certificate (it reads no CRL), so a kubelet
//! proves itself with this token instead, and the apiserver asks Polis about it
//! (`tokenreview`, a token webhook on every controller) whenever its short cache
//! (`TOKEN_CACHE_TTL`) has no answer. The curator makes a new token with every kubelet
//! serving certificate it issues and keeps only the secret's SHA-256 in the worker role
//! of the node's record; the token holds while the node is UP, holds KubernetesWorker
//! and this is its newest token. Decommissioning the node, taking the role away, or
//! issuing again ends it within the cache's lifetime.

use std::time::Duration;

/// The secret's length, bytes.
pub const SECRET_LEN: usize = 32;

/// How long the apiserver keeps an answer of the webhook: the bound, after a node is
/// decommissioned or loses the worker role, on its kubelet's requests being accepted.
pub const TOKEN_CACHE_TTL: Duration = Duration::from_secs(10);

/// A token made for a node: given to it once, stored only as `secret_sha256`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Made {
    pub token: String,
    pub secret_sha256: Vec<u8>,
}

/// A token as presented: the node it names and its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Presented {
    pub node_id: String,
    pub secret: Vec<u8>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("the system random source failed")]
    Random,
}

/// A new token for `node_id`.
pub fn make(node_id: &str) -> Result<Made, TokenError> {
    let mut secret = [0u8; SECRET_LEN];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
        .map_err(|_| TokenError::Random)?;
    Ok(Made {
        token: format!("{node_id}.{}", hex::encode(secret)),
        secret_sha256: digest(&secret),
    })
}

fn digest(secret: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, secret)
        .as_ref()
        .to_vec()
}

/// The node and secret of `token`; `None` when it is not one of ours (any other
/// bearer token the apiserver is shown: a service account's is a JWT).
pub fn parse(token: &str) -> Option<Presented> {
    let (node_id, secret) = token.rsplit_once('.')?;
    if node_id.is_empty() || secret.len() != SECRET_LEN * 2 {
        return None;
    }
    let secret = hex::decode(secret).ok()?;
    Some(Presented {
        node_id: node_id.to_string(),
        secret,
    })
}

/// Whether `presented` is the secret whose hash the node's record keeps (constant
/// time; an empty stored hash matches nothing).
pub fn matches(stored_sha256: &[u8], presented: &Presented) -> bool {
    use subtle::ConstantTimeEq;
    let hash = digest(&presented.secret);
    !stored_sha256.is_empty()
        && stored_sha256.len() == hash.len()
        && bool::from(stored_sha256.ct_eq(&hash))
}

/// The Kubernetes user a kubelet is known by (the Node authorizer and NodeRestriction
/// read it), and its groups.
pub fn user(node_id: &str) -> (String, [&'static str; 2]) {
    (
        format!("system:node:{node_id}"),
        ["system:nodes", "system:authenticated"],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_made_token_parses_and_matches_only_its_own_hash() {
        let made = make("polis-a1b2").unwrap();
        let presented = parse(&made.token).unwrap();
        assert_eq!(presented.node_id, "polis-a1b2");
        assert!(matches(&made.secret_sha256, &presented));
        let other = make("polis-a1b2").unwrap();
        assert!(!matches(&other.secret_sha256, &presented));
        assert!(!matches(&[], &presented));
        assert!(!matches(&made.secret_sha256[..31], &presented));
    }

    #[test]
    fn other_tokens_are_not_ours() {
        for token in [
            "",
            "abc",
            ".00",
            "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln",
            &format!("polis-a.{}", "zz".repeat(32)),
            &format!(".{}", "00".repeat(32)),
            &format!("polis-a.{}", "00".repeat(31)),
        ] {
            assert_eq!(parse(token), None, "{token}");
        }
        // A node ID with a dot still parses (the secret is after the last one).
        let p = parse(&format!("a.b.{}", "ab".repeat(32))).unwrap();
        assert_eq!(p.node_id, "a.b");
    }
}
