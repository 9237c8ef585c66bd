//! Polis' fuzz targets: one function per decoder of outside bytes (the network, the disk,
//! the command line), each fed arbitrary input by AFL++ (`src/main.rs`, run by
//! `scripts/fuzz`) and replayed over its seeds and kept crash inputs by `cargo test`.
//!
//! A target must never panic on any input: a panic is a crash. Besides not crashing,
//! targets assert what the decoders promise: what decodes re-encodes to the same thing,
//! what a validator accepted it accepts again, what one decoder accepted the next stage
//! takes. Each target comes with seeds made by the real encoders (`seeds`), so the
//! fuzzer starts from valid inputs instead of guessing magic numbers and signatures.
//!
//! ```text
//!   protos   node parameters, on-disk and etcd records, API requests and answers
//!   files    backup files, data key halves, data device markers and heads, node keys,
//!            etcd's metrics text
//!   x509     certificates (DER, PEM), CRLs, the curator's client classification,
//!            CA handovers
//!   text     epoch and forwarded-identity headers, operator and wire text fields
//! ```

mod files;
pub mod fixture;
mod protos;
mod text;
mod x509;

/// One fuzz target: its name on the command line, what runs one input, and its seeds.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// Every target, in the order `scripts/fuzz` runs them.
pub const TARGETS: &[Target] = &[
    Target {
        name: "node_parameters",
        run: protos::node_parameters,
        seeds: protos::node_parameters_seeds,
    },
    Target {
        name: "records",
        run: protos::records,
        seeds: protos::records_seeds,
    },
    Target {
        name: "api_messages",
        run: protos::api_messages,
        seeds: protos::api_messages_seeds,
    },
    Target {
        name: "backup_file",
        run: files::backup_file,
        seeds: files::backup_file_seeds,
    },
    Target {
        name: "datafs",
        run: files::datafs,
        seeds: files::datafs_seeds,
    },
    Target {
        name: "node_key",
        run: files::node_key,
        seeds: files::node_key_seeds,
    },
    Target {
        name: "selfreport",
        run: files::selfreport,
        seeds: files::selfreport_seeds,
    },
    Target {
        name: "certificate",
        run: x509::certificate,
        seeds: x509::certificate_seeds,
    },
    Target {
        name: "crl",
        run: x509::crl,
        seeds: x509::crl_seeds,
    },
    Target {
        name: "authenticator",
        run: x509::authenticator,
        seeds: x509::authenticator_seeds,
    },
    Target {
        name: "handover",
        run: x509::handover,
        seeds: x509::handover_seeds,
    },
    Target {
        name: "epoch_header",
        run: text::epoch_header,
        seeds: text::epoch_header_seeds,
    },
    Target {
        name: "forwarded_identity",
        run: text::forwarded_identity,
        seeds: text::forwarded_identity_seeds,
    },
    Target {
        name: "text_fields",
        run: text::text_fields,
        seeds: text::text_fields_seeds,
    },
];

/// The target named `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// Targets that cover several decoders take a first byte that picks one: each decoder
/// gets its own seeds and the fuzzer can move an input from one to another.
fn pick(data: &[u8], choices: usize) -> Option<(usize, &[u8])> {
    let (&first, rest) = data.split_first()?;
    Some((usize::from(first) % choices, rest))
}

/// `seed` behind the selector byte `choice` (see [`pick`]).
fn picked(choice: usize, seed: &[u8]) -> Vec<u8> {
    let mut out = vec![u8::try_from(choice).expect("few choices")];
    out.extend_from_slice(seed);
    out
}
