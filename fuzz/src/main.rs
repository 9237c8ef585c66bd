//! `polis-fuzz`: the one binary AFL++ runs for every target (built by `cargo afl build`,
//! run by `scripts/fuzz`). One binary rather than one per target: the dependencies
//! (tonic, rustls, etcd-client) are instrumented and linked once.
//!
//! ```text
//!   polis-fuzz TARGET        run TARGET under afl-fuzz (input on stdin or AFL's memory)
//!   polis-fuzz seeds DIR     write every target's seeds to DIR/TARGET/
//!   polis-fuzz list          the targets' names
//!   polis-fuzz fixture DIR   a new test CA for fuzz/fixtures (ca.der, ca.key.der)
//! ```

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["list"] => {
            for t in polis_fuzz::TARGETS {
                println!("{}", t.name);
            }
            ExitCode::SUCCESS
        }
        ["seeds", dir] => write_seeds(Path::new(dir)),
        ["fixture", dir] => {
            let (cert, key) = polis_fuzz::fixture::generate();
            let dir = Path::new(dir);
            for (name, bytes) in [("ca.der", cert), ("ca.key.der", key)] {
                if let Err(e) = std::fs::write(dir.join(name), bytes) {
                    eprintln!("writing {}: {e}", dir.join(name).display());
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        [name] => match polis_fuzz::target(name) {
            Some(target) => {
                afl::fuzz!(|data: &[u8]| (target.run)(data));
                ExitCode::SUCCESS
            }
            None => usage(&format!("no target {name:?} (polis-fuzz list names them)")),
        },
        _ => usage("expected a target, `seeds DIR`, `list` or `fixture DIR`"),
    }
}

fn write_seeds(dir: &Path) -> ExitCode {
    for t in polis_fuzz::TARGETS {
        let target_dir = dir.join(t.name);
        if let Err(e) = std::fs::create_dir_all(&target_dir) {
            eprintln!("creating {}: {e}", target_dir.display());
            return ExitCode::FAILURE;
        }
        for (i, seed) in (t.seeds)().iter().enumerate() {
            let path = target_dir.join(format!("seed-{i:02}"));
            if let Err(e) = std::fs::write(&path, seed) {
                eprintln!("writing {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

fn usage(why: &str) -> ExitCode {
    eprintln!("polis-fuzz: {why}\nusage: polis-fuzz TARGET | seeds DIR | list | fixture DIR");
    ExitCode::from(2)
}
