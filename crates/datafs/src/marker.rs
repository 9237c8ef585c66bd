//! The marker at the top of a Polis data file system (outside the encrypted directory,
//! not secret): which node of which cluster the device belongs to.
//!
//! ```text
//!   polis-datafs 1
//!   cluster <cluster>
//!   node <node>
//! ```
//!
//! It lets a device of another node or cluster be refused by name before any key is
//! tried; it grants nothing (the key check on the encrypted directory does).

/// The owner a data file system is made for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub cluster: String,
    pub node: String,
}

/// File name of the marker at the file system's top.
pub const FILE: &str = "polis-datafs";
const HEADER: &str = "polis-datafs 1";

/// Why a marker could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MarkerError {
    #[error("first line is {0:?}, not {HEADER:?}")]
    Header(String),
    #[error("missing or malformed {0:?} line")]
    Field(&'static str),
    #[error("unexpected line {0:?}")]
    Extra(String),
}

impl Owner {
    /// Checks that both names fit on a marker line.
    pub fn validate(&self) -> Result<(), String> {
        for (what, v) in [("cluster", &self.cluster), ("node", &self.node)] {
            if v.is_empty() || v.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(format!(
                    "{what} name {v:?} must be non-empty without whitespace"
                ));
            }
        }
        Ok(())
    }

    pub fn encode(&self) -> String {
        format!("{HEADER}\ncluster {}\nnode {}\n", self.cluster, self.node)
    }

    pub fn decode(text: &str) -> Result<Owner, MarkerError> {
        let mut lines = text.lines();
        let header = lines.next().unwrap_or("");
        if header != HEADER {
            return Err(MarkerError::Header(header.to_string()));
        }
        let mut field = |name: &'static str| {
            lines
                .next()
                .and_then(|l| l.strip_prefix(name))
                .and_then(|l| l.strip_prefix(' '))
                .filter(|v| !v.is_empty() && !v.contains(char::is_whitespace))
                .map(str::to_string)
                .ok_or(MarkerError::Field(name))
        };
        let cluster = field("cluster")?;
        let node = field("node")?;
        if let Some(extra) = lines.find(|l| !l.is_empty()) {
            return Err(MarkerError::Extra(extra.to_string()));
        }
        Ok(Owner { cluster, node })
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node {} of cluster {}", self.node, self.cluster)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner {
        Owner {
            cluster: "c1".into(),
            node: "metropolis-abc".into(),
        }
    }

    #[test]
    fn round_trips() {
        assert_eq!(Owner::decode(&owner().encode()).unwrap(), owner());
    }

    #[test]
    fn malformed_markers_are_named() {
        assert_eq!(
            Owner::decode("hello\n"),
            Err(MarkerError::Header("hello".into()))
        );
        assert_eq!(
            Owner::decode("polis-datafs 1\nnode x\n"),
            Err(MarkerError::Field("cluster"))
        );
        assert_eq!(
            Owner::decode("polis-datafs 1\ncluster c\nnode \n"),
            Err(MarkerError::Field("node"))
        );
        assert_eq!(
            Owner::decode("polis-datafs 1\ncluster c\nnode n\nkey k\n"),
            Err(MarkerError::Extra("key k".into()))
        );
    }

    #[test]
    fn names_with_whitespace_are_refused() {
        let mut o = owner();
        o.node = "a b".into();
        assert!(o.validate().is_err());
        o.node = String::new();
        assert!(o.validate().is_err());
        assert!(owner().validate().is_ok());
    }
}

/// Properties over arbitrary text (proptest).
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn valid_owners_round_trip(cluster in "[^\\s]{1,40}", node in "[^\\s]{1,40}") {
            let owner = Owner { cluster, node };
            prop_assert_eq!(Owner::decode(&owner.encode()), Ok(owner));
        }

        #[test]
        fn what_decodes_round_trips(
            text in prop_oneof![
                any::<String>(),
                "polis-datafs 1\ncluster [^\n]{0,8}\nnode [^\n]{0,8}\n[ \n]{0,3}",
            ],
        ) {
            if let Ok(owner) = Owner::decode(&text) {
                prop_assert_eq!(Owner::decode(&owner.encode()), Ok(owner));
            }
        }
    }
}
