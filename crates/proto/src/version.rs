//! Versions that talk to each other: Polis' version-skew policy (pure).
//!
//! A node and a curator work together while their versions have the same major number
//! and minor numbers at most [`MAX_MINOR_SKEW`] apart, in either direction; the patch
//! number never matters. A cluster is upgraded one minor version at a time, one node at
//! a time (docs/upgrades.md, "Upgrading"): every node of the old version keeps talking to every
//! node of the new one throughout. The curator refuses the heartbeats of a node outside
//! the policy, naming both versions; `polisctl cluster versions` shows where each node
//! stands.
//!
//! Versions are `MAJOR.MINOR.PATCH` (Cargo's), with an optional `-pre` or `+build`
//! suffix, which is ignored.

use std::fmt;

/// How many minor versions a node and a curator may be apart.
pub const MAX_MINOR_SKEW: u64 = 1;

/// A parsed version (the suffix dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// `MAJOR.MINOR.PATCH[-pre][+build]`; `None` for anything else.
pub fn parse(text: &str) -> Option<Version> {
    let core = text.split(['-', '+']).next()?;
    let mut parts = core.split('.');
    let mut number = || -> Option<u64> {
        let part = parts.next()?;
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    let version = Version {
        major: number()?,
        minor: number()?,
        patch: number()?,
    };
    parts.next().is_none().then_some(version)
}

/// Why two versions may not work together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkewError {
    /// Not a version at all.
    Unreadable(String),
    /// Readable, outside the policy.
    TooFarApart { node: Version, curator: Version },
}

impl fmt::Display for SkewError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkewError::Unreadable(text) => {
                write!(f, "{text:?} is not a version (MAJOR.MINOR.PATCH)")
            }
            SkewError::TooFarApart { node, curator } => write!(
                f,
                "node version {node} and curator version {curator} are outside the \
                 version-skew policy (same major version, at most {MAX_MINOR_SKEW} minor \
                 version apart): upgrade one minor version at a time"
            ),
        }
    }
}

/// Whether a node of version `node` and a curator of version `curator` work together.
pub fn check_skew(node: &str, curator: &str) -> Result<(), SkewError> {
    let read = |text: &str| parse(text).ok_or_else(|| SkewError::Unreadable(text.to_string()));
    let (n, c) = (read(node)?, read(curator)?);
    if n.major == c.major && n.minor.abs_diff(c.minor) <= MAX_MINOR_SKEW {
        Ok(())
    } else {
        Err(SkewError::TooFarApart {
            node: n,
            curator: c,
        })
    }
}

/// Whether every one of `versions` works with every other: the oldest and the newest
/// within the policy. Unreadable ones are returned as the error.
pub fn all_within_skew<'a>(versions: impl IntoIterator<Item = &'a str>) -> Result<(), SkewError> {
    let mut parsed = Vec::new();
    for text in versions {
        parsed.push(parse(text).ok_or_else(|| SkewError::Unreadable(text.to_string()))?);
    }
    let (Some(oldest), Some(newest)) = (parsed.iter().min(), parsed.iter().max()) else {
        return Ok(());
    };
    check_skew(&oldest.to_string(), &newest.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_with_and_without_suffixes() {
        let v = |major, minor, patch| Version {
            major,
            minor,
            patch,
        };
        assert_eq!(parse("0.1.0"), Some(v(0, 1, 0)));
        assert_eq!(parse("1.12.3-rc.1"), Some(v(1, 12, 3)));
        assert_eq!(parse("2.0.1+build.7"), Some(v(2, 0, 1)));
        for bad in [
            "", "1", "1.2", "1.2.3.4", "a.b.c", "1..3", "1.2.x", " 1.2.3", "-1.2.3", "bench",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn one_minor_version_apart_either_way_works_two_do_not() {
        assert!(check_skew("0.1.0", "0.1.9").is_ok());
        assert!(check_skew("0.1.0", "0.2.0").is_ok());
        assert!(check_skew("0.2.5", "0.1.0").is_ok());
        assert!(check_skew("1.4.0", "1.5.2-rc.1").is_ok());
        let far = check_skew("0.1.0", "0.3.0").unwrap_err();
        assert!(matches!(far, SkewError::TooFarApart { .. }));
        let text = far.to_string();
        assert!(text.contains("node version 0.1.0") && text.contains("curator version 0.3.0"));
        assert!(
            check_skew("1.9.0", "2.0.0").is_err(),
            "a major step is never within"
        );
        assert!(matches!(
            check_skew("bench", "0.1.0"),
            Err(SkewError::Unreadable(t)) if t == "bench"
        ));
    }

    #[test]
    fn a_cluster_is_within_the_policy_when_its_oldest_and_newest_are() {
        assert!(all_within_skew(["0.1.0", "0.2.3", "0.2.0"]).is_ok());
        assert!(all_within_skew(["0.1.0", "0.2.3", "0.3.0"]).is_err());
        assert!(all_within_skew(std::iter::empty()).is_ok());
        assert!(all_within_skew(["0.1.0", "x"]).is_err());
    }
}
