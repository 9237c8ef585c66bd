//! Scheduled snapshots and the cluster configuration, as `cluster backups` and
//! `cluster config` show them; the age of a snapshot as `cluster status` words it.
//! May not talk to the cluster or touch files: results in, text on stdout out.

use proto::api;
use proto::config::ClusterConfiguration;
use serde_json::json;

use crate::output::{self, Format, escape};

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// How long ago `unix_ms` was: `12s`, `5m`, `3h`, `2d`.
pub(crate) fn age(unix_ms: u64) -> String {
    let secs = now_ms().saturating_sub(unix_ms) / 1000;
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// `cluster backups`.
pub(crate) fn print_list(answer: &api::ListSnapshotsResponse, format: Format) {
    let value = json!({
        "snapshots": answer.snapshots.iter().map(|s| json!({
            "node": s.node_id,
            "name": s.name,
            "revision": s.revision,
            "size": s.size,
            "taken_at": output::utc_time(s.taken_at_unix_ms),
            "taken_at_unix_ms": s.taken_at_unix_ms,
        })).collect::<Vec<_>>(),
        "unreachable": answer.unreachable,
    });
    match format {
        Format::Quiet => {}
        Format::Json => println!("{value}"),
        Format::Yaml => print!("{}", output::yaml(&value)),
        Format::Table => {
            let rows: Vec<Vec<String>> = answer
                .snapshots
                .iter()
                .map(|s| {
                    vec![
                        s.node_id.clone(),
                        s.name.clone(),
                        s.revision.to_string(),
                        proto::quota::show(s.size),
                        age(s.taken_at_unix_ms),
                    ]
                })
                .collect();
            print!(
                "{}",
                output::table(&["NODE", "NAME", "REVISION", "SIZE", "AGE"], &rows)
            );
            for u in &answer.unreachable {
                println!("unreachable: {}", escape(u));
            }
        }
    }
}

/// `cluster config` (and the answer of `cluster config set`).
pub(crate) fn print_config(c: &ClusterConfiguration, format: Format) {
    let schedule = proto::snapshots::effective(
        c.snapshot_interval_seconds,
        c.snapshot_keep,
        proto::snapshots::Bounds::TESTING,
    );
    let interval = proto::snapshots::show(schedule.interval.as_secs());
    let quota = proto::quota::effective_quota(c.etcd_quota_bytes).unwrap_or(c.etcd_quota_bytes);
    let value = json!({
        "cluster_domain": c.cluster_domain,
        "node_certificate_lifetime_seconds": c.node_certificate_lifetime_seconds,
        "owner_certificate_lifetime_seconds": c.owner_certificate_lifetime_seconds,
        "etcd_quota_bytes": quota,
        "snapshot_interval": interval,
        "snapshot_interval_seconds": schedule.interval.as_secs(),
        "snapshot_keep": schedule.keep,
    });
    let lifetime = |s: u64| {
        if s == 0 {
            "default".to_string()
        } else {
            proto::snapshots::show(s)
        }
    };
    match format {
        Format::Quiet => {}
        Format::Json => println!("{value}"),
        Format::Yaml => print!("{}", output::yaml(&value)),
        Format::Table => {
            println!("Cluster domain:              {}", escape(&c.cluster_domain));
            println!(
                "Node certificate lifetime:   {}",
                lifetime(c.node_certificate_lifetime_seconds)
            );
            println!(
                "Owner certificate lifetime:  {}",
                lifetime(c.owner_certificate_lifetime_seconds)
            );
            println!("etcd quota:                  {}", proto::quota::show(quota));
            println!("Snapshot interval:           {interval}");
            println!("Snapshots kept per member:   {}", schedule.keep);
        }
    }
}
