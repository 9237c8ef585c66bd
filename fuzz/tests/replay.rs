//! Every target over its seeds and over the inputs kept in `regressions/TARGET/`
//! (crashes the fuzzer found, fixed since): plain `cargo test`, no fuzzer needed.

use std::path::Path;

#[test]
fn seeds_and_kept_inputs_run_clean() {
    let kept = Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions");
    for target in polis_fuzz::TARGETS {
        let seeds = (target.seeds)();
        assert!(!seeds.is_empty(), "{} has no seeds", target.name);
        for seed in &seeds {
            (target.run)(seed);
        }
        let Ok(entries) = std::fs::read_dir(kept.join(target.name)) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            (target.run)(&std::fs::read(&path).unwrap());
        }
    }
}

#[test]
fn every_regression_directory_names_a_target() {
    let kept = Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions");
    for entry in std::fs::read_dir(kept).unwrap() {
        let name = entry.unwrap().file_name();
        let name = name.to_str().unwrap();
        assert!(
            name == "README.md" || polis_fuzz::target(name).is_some(),
            "regressions/{name} names no target"
        );
    }
}
