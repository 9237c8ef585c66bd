//! The once-per-start decision (taken in preflight, carried out by the cluster manager),
//! as a pure function: no I/O, and imports no other module of this crate.
//!
//! ```text
//!   sealed configuration present ───────────────────────────────▶ Join
//!   node parameters: register, no etcd data ────────────────────▶ Register (a node key
//!                                                                  or certificate left by
//!                                                                  an interrupted
//!                                                                  registration: resumed)
//!   bootstrap parameters, and the root holds only what an ──────▶ Bootstrap (resumed: the
//!   interrupted bootstrap with these same parameters left          same node key, the same
//!   (its trace, see `BootstrapTrace`)                              etcd, stored CAs)
//!   no sealed configuration, but etcd data or credentials ──────▶ refuse (second cluster)
//!   node parameters: bootstrap ─────────────────────────────────▶ Bootstrap
//!   nothing ────────────────────────────────────────────────────▶ refuse (nothing to do)
//! ```
//! A registration resumes with the key it started with, so a root never registers two
//! keys; it never holds etcd data (only consensus members do, and they have sealed
//! configurations). A bootstrap records its parameters before anything else
//! (`data/node/bootstrap.pb`), so its partial state can be told from anyone else's: it
//! resumes only under the same parameters and only when everything found belongs to it
//! (checked against the node key before the start, and etcd's membership once etcd
//! runs, in `bootstrap::finish`).

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
    /// What an interrupted bootstrap left, if the root holds its record.
    pub bootstrap_trace: Option<BootstrapTrace>,
}

/// An interrupted bootstrap's record in the root, judged against this start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapTrace {
    /// The recorded bootstrap parameters equal the ones given to this start.
    pub same_parameters: bool,
    /// Why some state in the root is not that bootstrap's (a node key other than the
    /// one its peer certificate or node certificate is for, etcd data without its node
    /// key or peer files); `None`: all of it is.
    pub foreign: Option<String>,
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
         so a start would create a second cluster{why}. A bootstrap or registration was interrupted before it \
         finished; an interrupted bootstrap resumes when started with the same parameters; to start over, \
         remove {data} (this destroys that node's cluster data)",
        list(.found), sealed = .sealed.display(), data = .data.display()
    )]
    StateWithoutSealedConfiguration {
        found: Vec<PathBuf>,
        sealed: PathBuf,
        data: PathBuf,
        /// Why an interrupted bootstrap cannot resume (with a leading separator).
        why: String,
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
    let trace = facts.bootstrap_trace.as_ref();
    if facts.parameters == Some(ParametersKind::Register) && !facts.etcd_data && trace.is_none() {
        return Ok(Decision::Register);
    }
    if let Some(t) = trace
        && facts.parameters == Some(ParametersKind::Bootstrap)
        && t.same_parameters
        && t.foreign.is_none()
    {
        return Ok(Decision::Bootstrap);
    }
    if !facts.cluster_state.is_empty() || trace.is_some() {
        let why = match trace {
            None => String::new(),
            Some(_) if facts.parameters != Some(ParametersKind::Bootstrap) => {
                " (an interrupted bootstrap resumes only with bootstrap parameters)".into()
            }
            Some(BootstrapTrace {
                foreign: Some(f), ..
            }) => format!(" ({f})"),
            Some(_) => " (an interrupted bootstrap with other parameters left it; it resumes only \
                 with the same ones)"
                .into(),
        };
        return Err(DecisionError::StateWithoutSealedConfiguration {
            found: facts.cluster_state.clone(),
            sealed: sealed_path,
            data: data_dir,
            why,
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
            bootstrap_trace: None,
        }
    }

    fn trace(f: RootFacts, same_parameters: bool, foreign: Option<&str>) -> RootFacts {
        RootFacts {
            bootstrap_trace: Some(BootstrapTrace {
                same_parameters,
                foreign: foreign.map(String::from),
            }),
            ..f
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

    #[test]
    fn interrupted_bootstraps() {
        use ParametersKind::*;
        let key_only = || {
            let mut f = facts(false, false, Some(Bootstrap));
            f.cluster_state = vec![PathBuf::from("/r/data/node/key.der")];
            f
        };
        // Its own partial state, at any step, under the same parameters: resumed.
        check(
            trace(facts(false, false, Some(Bootstrap)), true, None),
            Ok(Decision::Bootstrap),
        );
        check(trace(key_only(), true, None), Ok(Decision::Bootstrap));
        check(
            trace(facts(false, true, Some(Bootstrap)), true, None),
            Ok(Decision::Bootstrap),
        );
        // A sealed configuration still means join.
        check(
            trace(facts(true, true, Some(Bootstrap)), true, None),
            Ok(Decision::Join),
        );
        // Other parameters, other state, other intentions: refused.
        let other = trace(facts(false, true, Some(Bootstrap)), false, None);
        check(other, Err("with the same ones"));
        let foreign = trace(
            facts(false, true, Some(Bootstrap)),
            true,
            Some("peer cert for another key"),
        );
        check(foreign, Err("peer cert for another key"));
        // A record of parameters alone still names the bootstrap, not a fresh start.
        check(
            trace(facts(false, false, Some(Bootstrap)), false, None),
            Err("second cluster"),
        );
        // A bootstrap's key never becomes a registering node's.
        let mut register = trace(key_only(), true, None);
        register.parameters = Some(Register);
        check(register, Err("only with bootstrap parameters"));
        check(
            trace(facts(false, false, None), true, None),
            Err("second cluster"),
        );
        // Without a trace, a key (e.g. a registration in progress) is not a bootstrap's.
        check(key_only(), Err("second cluster"));
    }
}
