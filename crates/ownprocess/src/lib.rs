//! Runs a test that changes process-wide state (resource limits, environment, umask,
//! current directory, signal dispositions) in a process of its own, whatever the runner.
//!
//! nextest already gives every test a process; `cargo test` runs a crate's tests as
//! threads of one process, where such a test breaks its neighbours (a lowered
//! `RLIMIT_NOFILE` made a neighbour's socket fail with `BrokenPipe`). A test that calls
//! [`in_own_process`] re-runs its own test binary for just itself and checks that the
//! child ran exactly that test and passed; in the child, the body runs.
//!
//! ```text
//!   runner ── test t (parent) ── spawn current_exe --exact t ──▶ child: body()
//!                                 POLIS_OWN_PROCESS=t            exit 0 / panic
//!            ◀─ assert: exit 0 and "1 passed" ──────────────────┘
//! ```
//! Used only from tests (a dev-dependency); no dependencies of its own.

use std::process::Command;

/// The variable naming the one test a child process runs for real.
const CHILD: &str = "POLIS_OWN_PROCESS";

/// The test harness's name for function `function` of the module `module_path` (as
/// `module_path!()` gives it: the crate's name first, which the harness leaves out).
pub fn test_name(module_path: &str, function: &str) -> String {
    match module_path.split_once("::") {
        Some((_crate, rest)) => format!("{rest}::{function}"),
        None => function.to_string(),
    }
}

/// Runs `body` in a process of its own: in the parent, re-runs this test binary with a
/// filter for exactly this test and panics unless that child ran it and it passed; in
/// the child (the variable set to this test's name), runs `body`.
/// Call as `in_own_process(module_path!(), "the_test_fn", || { ... })`. Returns `true` in
/// the parent (the child passed) and `false` in the child, for code after it that must
/// run in one of them only.
pub fn in_own_process(module_path: &str, function: &str, body: impl FnOnce()) -> bool {
    let name = test_name(module_path, function);
    if std::env::var(CHILD).is_ok_and(|running| running == name) {
        body();
        return false;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let output = Command::new(&exe)
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, &name)
        .output()
        .unwrap_or_else(|e| panic!("re-running {} for {name}: {e}", exe.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{name} failed in its own process ({}):\n{stdout}\n{stderr}",
        output.status
    );
    // A filter that matched nothing would pass without running the body.
    assert!(
        stdout.contains("1 passed"),
        "{name} did not run in its own process (filter matched no test?):\n{stdout}\n{stderr}"
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_the_harness_does() {
        assert_eq!(test_name("rpc::server::tests", "t"), "server::tests::t");
        assert_eq!(test_name("launch", "t"), "t");
    }

    #[test]
    fn the_body_runs_in_another_process() {
        // The child writes its pid where the parent (its parent process) looks.
        let marker = |parent: u32| std::env::temp_dir().join(format!("ownprocess-{parent}"));
        let parent = in_own_process(module_path!(), "the_body_runs_in_another_process", || {
            let path = marker(std::os::unix::process::parent_id());
            std::fs::write(path, std::process::id().to_string()).unwrap();
            // SAFETY: this process runs this test alone (the point of the crate).
            unsafe { std::env::set_var("OWNPROCESS_MARK", "child") };
        });
        if !parent {
            return;
        }
        let path = marker(std::process::id());
        let child: u32 = std::fs::read_to_string(&path).unwrap().parse().unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_ne!(child, std::process::id());
        assert!(
            std::env::var("OWNPROCESS_MARK").is_err(),
            "leaked into the parent"
        );
    }

    #[test]
    #[should_panic(expected = "failed in its own process")]
    fn a_failing_body_fails_the_parent() {
        in_own_process(module_path!(), "a_failing_body_fails_the_parent", || {
            panic!("the body fails")
        });
    }
}
