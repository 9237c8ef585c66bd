//! A cluster CA rotation's state, as `cluster rotate-ca` and `cluster ca` show it.
//! May not talk to the cluster.

use proto::api;
use serde_json::{Value, json};

use crate::output::{self, Format, escape_text};

fn rotation_json(r: &api::CaRotation) -> Value {
    json!({
        "phase": r.phase,
        "trusted_ca_fingerprints": r.trusted_ca_fingerprints,
        "waiting_for": r.waiting_for,
        "forced": r.forced,
        "started": r.started,
        "etcd_peer": r.etcd_peer,
    })
}

/// The phase, the CAs trusted (the signing one first) and what the rotation waits for.
pub(crate) fn print_rotation(r: &api::CaRotation, format: Format) {
    match format {
        Format::Quiet => {}
        Format::Json => println!("{}", rotation_json(r)),
        Format::Yaml => print!("{}", output::yaml(&rotation_json(r))),
        Format::Table => {
            let what = if r.etcd_peer {
                "etcd peer CA"
            } else {
                "cluster CA"
            };
            if r.started {
                println!(
                    "{what} rotation started: the new CA is trusted everywhere before it signs."
                );
            }
            let forced = if r.forced { " (forced)" } else { "" };
            println!("{what} phase: {}{forced}", escape_text(&r.phase));
            for (i, fingerprint) in r.trusted_ca_fingerprints.iter().enumerate() {
                let role = if i == 0 { "signing" } else { "trusted" };
                println!("{role}: SHA256:{}", escape_text(fingerprint));
            }
            if !r.waiting_for.is_empty() {
                println!("waiting for:");
                for line in &r.waiting_for {
                    println!("  {}", escape_text(line));
                }
            }
        }
    }
}
