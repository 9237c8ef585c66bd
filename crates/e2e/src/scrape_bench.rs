//! The scrape mode of `bench-heartbeats` (`scripts/bench metrics`): every member of the
//! control plane's `/metrics` fetched in turn, round after round, once the leader's
//! carries a heartbeat age per node. Reports each member's p50/p99/max, size and series,
//! and the whole round (every member one after the other: the cost of scraping the
//! control plane once) as one JSON object.
//!
//! Plain HTTP GETs over loopback (`scrape::http_get`); starts no process.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use serde_json::{Value, json};

use crate::scrape::{METRICS_PORT, http_get};

/// The goal for one member's scrape, p99 (ms).
pub const TARGET_P99_MS: f64 = 10.0;

/// The `p` quantile of sorted durations, in ms (0 when empty).
fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64) * p).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1].as_secs_f64() * 1000.0
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// p50/p99/max (ms) of `latencies` (sorted here).
fn spread(latencies: &mut [Duration]) -> Value {
    latencies.sort();
    json!({
        "p50_ms": round2(percentile_ms(latencies, 0.5)),
        "p99_ms": round2(percentile_ms(latencies, 0.99)),
        "max_ms": round2(percentile_ms(latencies, 1.0)),
    })
}

/// One member's scrapes.
#[derive(Default)]
struct Member {
    latencies: Vec<Duration>,
    bytes: usize,
    series: usize,
    heartbeat_ages: usize,
}

fn heartbeat_ages(body: &str) -> usize {
    body.matches("polis_node_heartbeat_age_seconds{").count()
}

async fn get(at: SocketAddr) -> Result<(Duration, String)> {
    let t = Instant::now();
    let (status, body) = tokio::task::spawn_blocking(move || http_get(at, "/metrics")).await??;
    let took = t.elapsed();
    ensure!(status == 200, "/metrics on {at} answered {status}");
    Ok((took, body))
}

/// Waits (up to six heartbeat periods) until one member — the curator leader, which
/// exports the nodes — carries more than `nodes` heartbeat ages (the simulated nodes and
/// the members' own), then scrapes every member `scrapes` times, one GET at a time.
pub async fn scrape_members(
    members: &[IpAddr],
    nodes: usize,
    scrapes: usize,
    period: Duration,
) -> Result<Value> {
    ensure!(!members.is_empty(), "no member to scrape");
    let targets: Vec<SocketAddr> = members
        .iter()
        .map(|ip| SocketAddr::new(*ip, METRICS_PORT))
        .collect();
    let deadline = Instant::now() + period * 6;
    loop {
        let mut most = 0;
        for at in &targets {
            most = most.max(heartbeat_ages(&get(*at).await?.1));
        }
        if most > nodes {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "no curator exports more than {most} heartbeat ages, not {}",
                nodes + 1
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut each: Vec<Member> = targets.iter().map(|_| Member::default()).collect();
    let mut rounds = Vec::with_capacity(scrapes);
    for _ in 0..scrapes {
        let mut round = Duration::ZERO;
        for (at, member) in targets.iter().zip(&mut each) {
            let (took, body) = get(*at).await?;
            round += took;
            member.latencies.push(took);
            member.bytes = body.len();
            member.series = body.lines().filter(|l| !l.starts_with('#')).count();
            member.heartbeat_ages = heartbeat_ages(&body);
        }
        rounds.push(round);
    }
    let per_member: Vec<Value> = targets
        .iter()
        .zip(&mut each)
        .map(|(at, m)| {
            let mut line = spread(&mut m.latencies);
            line["member"] = at.ip().to_string().into();
            line["bytes"] = m.bytes.into();
            line["series"] = m.series.into();
            line["heartbeat_ages"] = m.heartbeat_ages.into();
            line
        })
        .collect();
    let worst_p99 = per_member
        .iter()
        .filter_map(|m| m["p99_ms"].as_f64())
        .fold(0.0, f64::max);
    let mut total = spread(&mut rounds);
    total["bytes"] = each.iter().map(|m| m.bytes).sum::<usize>().into();
    total["series"] = each.iter().map(|m| m.series).sum::<usize>().into();
    Ok(json!({
        "bench": "metrics",
        "nodes": nodes,
        "members": targets.len(),
        "scrapes": scrapes,
        "per_member": per_member,
        "round": total,
        "worst_member_p99_ms": worst_p99,
        "target_p99_ms": TARGET_P99_MS,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_scrape_times() {
        let mut ms: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let s = spread(&mut ms);
        assert_eq!(s["p50_ms"], 50.0);
        assert_eq!(s["p99_ms"], 99.0);
        assert_eq!(s["max_ms"], 100.0);
        assert_eq!(spread(&mut [])["max_ms"], 0.0);
        assert_eq!(
            heartbeat_ages(
                "polis_node_heartbeat_age_seconds{node=\"a\"} 1\n\
                 polis_node_heartbeat_age_seconds{node=\"b\"} 2\npolis_x 1\n"
            ),
            2
        );
    }
}
