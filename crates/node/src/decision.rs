//! The once-per-start decision of the cluster manager, as a pure function.
//!
//! ```text
//!   sealed configuration present ───────────────────────────────▶ Join
//!   node parameters: register, no etcd data ────────────────────▶ Register (a node key
//!                                                                  or certificate left by
//!                                                                  an interrupted
//!                                                                  registration: resumed)
//!   no sealed configuration, but etcd data or credentials ──────▶ refuse (second cluster)
//!   node parameters: bootstrap ─────────────────────────────────▶ Bootstrap
//!   nothing ────────────────────────────────────────────────────▶ refuse (nothing to do)
//! ```
//! A registration resumes with the key it started with, so a root never registers two
//! keys; it never holds etcd data (only consensus members do, and they have sealed
//! configurations).

use std::fmt;
use std::path::PathBuf;

/// What the root holds, as far as the decision is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootFacts {
    pub sealed_configuration: Option<PathBuf>,
    /// Files or directories holding cluster state (etcd data, credentials).
    pub cluster_state: Vec<PathBuf>,
    /// Whether etcd data is among them.
    pub etcd_data: bool,
    pub parameters: Option<ParametersKind>,
    /// Where parameters were looked for (for the error message).
    pub parameters_path: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParametersKind {
    Bootstrap,
    Register,
    /// Parameters that name no cluster action.
    Empty,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Join,
    Bootstrap,
    Register,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecisionError {
    #[error(
        "refusing to start: the root holds cluster state ({}) but no sealed configuration at {sealed}, \
         so a start would create a second cluster. A bootstrap or registration was interrupted before it \
         finished; to start over, remove {data} (this destroys that node's cluster data)",
        list(.found), sealed = .sealed.display(), data = .data.display()
    )]
    StateWithoutSealedConfiguration {
        found: Vec<PathBuf>,
        sealed: PathBuf,
        data: PathBuf,
    },
    #[error(
        "nothing to do: no sealed configuration at {sealed} and no node parameters at {params}; \
         create parameters with `polisctl params bootstrap --out FILE` and pass --params FILE",
        sealed = .sealed.display(), params = .params.display()
    )]
    NothingToDo { sealed: PathBuf, params: PathBuf },
    #[error("node parameters at {} name neither bootstrap nor register", .0.display())]
    EmptyParameters(PathBuf),
}

fn list(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Decides what this start does. `data_dir` is only used in messages.
pub fn decide(
    facts: &RootFacts,
    sealed_path: PathBuf,
    data_dir: PathBuf,
) -> Result<Decision, DecisionError> {
    if facts.sealed_configuration.is_some() {
        return Ok(Decision::Join);
    }
    if facts.parameters == Some(ParametersKind::Register) && !facts.etcd_data {
        return Ok(Decision::Register);
    }
    if !facts.cluster_state.is_empty() {
        return Err(DecisionError::StateWithoutSealedConfiguration {
            found: facts.cluster_state.clone(),
            sealed: sealed_path,
            data: data_dir,
        });
    }
    match facts.parameters {
        Some(ParametersKind::Bootstrap) => Ok(Decision::Bootstrap),
        Some(ParametersKind::Register) => Ok(Decision::Register),
        Some(ParametersKind::Empty) => Err(DecisionError::EmptyParameters(
            facts.parameters_path.clone(),
        )),
        None => Err(DecisionError::NothingToDo {
            sealed: sealed_path,
            params: facts.parameters_path.clone(),
        }),
    }
}

/// The cluster state as seen by this node (DESIGN.md, Lifecycle). Disowning and Split
/// arrive with the features that enter them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterState {
    /// Not yet known: the node is starting.
    Unknown,
    /// Registered with a cluster, waiting for the owner's approval.
    Foreign,
    /// Approved; committing (receiving its certificate).
    Trusted,
    /// Full member of its cluster.
    Home,
}

impl fmt::Display for ClusterState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(sealed: bool, state: bool, params: Option<ParametersKind>) -> RootFacts {
        RootFacts {
            sealed_configuration: sealed.then(|| PathBuf::from("/r/esp/sealed")),
            cluster_state: if state {
                vec![PathBuf::from("/r/data/etcd/data")]
            } else {
                vec![]
            },
            etcd_data: state,
            parameters: params,
            parameters_path: PathBuf::from("/r/esp/parameters.pb"),
        }
    }

    fn check(f: RootFacts, expected: Result<Decision, &str>) {
        let got = decide(&f, "/r/esp/sealed".into(), "/r/data".into());
        match (got, expected) {
            (Ok(g), Ok(e)) => assert_eq!(g, e, "{f:?}"),
            (Err(g), Err(needle)) => {
                let msg = g.to_string();
                assert!(msg.contains(needle), "{f:?}: {msg}");
            }
            (g, e) => panic!("{f:?}: got {g:?}, expected {e:?}"),
        }
    }

    #[test]
    fn decisions() {
        use ParametersKind::*;
        check(facts(true, true, None), Ok(Decision::Join));
        check(facts(true, true, Some(Bootstrap)), Ok(Decision::Join));
        check(facts(true, false, None), Ok(Decision::Join));
        check(
            facts(false, false, Some(Bootstrap)),
            Ok(Decision::Bootstrap),
        );
        check(facts(false, false, Some(Register)), Ok(Decision::Register));
        check(facts(false, true, Some(Register)), Err("second cluster"));
        // A key (and certificate) from an interrupted registration: resume it.
        let mut resumed = facts(false, false, Some(Register));
        resumed.cluster_state = vec![PathBuf::from("/r/data/node/key.der")];
        check(resumed.clone(), Ok(Decision::Register));
        // The same key under bootstrap parameters is refused.
        resumed.parameters = Some(Bootstrap);
        check(resumed, Err("second cluster"));
        check(facts(false, true, Some(Bootstrap)), Err("second cluster"));
        check(facts(false, true, None), Err("/r/data/etcd/data"));
        check(facts(false, false, None), Err("polisctl params bootstrap"));
        check(
            facts(false, false, Some(Empty)),
            Err("neither bootstrap nor register"),
        );
    }
}
