//! Every metric family a node exports, in one process-wide registry ([`global`]): the
//! parts of the node update the handles here, the endpoint encodes the registry.
//!
//! Holds no I/O; may not know where its values come from (the node and the curator set
//! them).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::member::EtcdMember;
use crate::process::ProcessCollector;
use crate::snapshot::GaugeSnapshot;

/// Labels of an RPC series: gRPC service and method (and, for the counter, code).
pub type CallLabels = [(&'static str, String); 3];
pub type MethodLabels = [(&'static str, String); 2];
type OneLabel = [(&'static str, String); 1];

/// Latency buckets of curator RPCs, in seconds: 0.5 ms … 10 s.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The families; cheap to clone handles (each is an `Arc` inside).
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    pub rpc_calls: Family<CallLabels, Counter>,
    pub rpc_latency: Family<MethodLabels, Histogram>,
    pub forwarded_calls: Counter,
    pub curator_leader: Gauge,
    pub curator_leadership_changes: Counter,
    pub nodes: Arc<GaugeSnapshot>,
    pub heartbeat_age: Arc<GaugeSnapshot>,
    pub etcd_member: Arc<EtcdMember>,
    pub supervisor_restarts: Family<OneLabel, Counter>,
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let m = Metrics {
            registry: Mutex::new(Registry::default()),
            rpc_calls: Family::default(),
            rpc_latency: Family::new_with_constructor(|| Histogram::new(LATENCY_BUCKETS)),
            forwarded_calls: Counter::default(),
            curator_leader: Gauge::default(),
            curator_leadership_changes: Counter::default(),
            nodes: Arc::new(GaugeSnapshot::new(
                "polis_nodes",
                "Nodes of the cluster by state and health (exported by the curator leader)",
            )),
            heartbeat_age: Arc::new(GaugeSnapshot::new(
                "polis_node_heartbeat_age_seconds",
                "Seconds since each UP node's last heartbeat (exported by the curator leader)",
            )),
            etcd_member: Arc::default(),
            supervisor_restarts: Family::default(),
        };
        let mut top = Registry::default();
        top.register_collector(Box::new(ProcessCollector));
        let r = top.sub_registry_with_prefix("polis");
        r.register(
            "curator_rpc_calls",
            "Curator RPCs answered, by gRPC service, method and status code",
            m.rpc_calls.clone(),
        );
        r.register_with_unit(
            "curator_rpc_duration",
            "Curator RPC latency until the response headers, by service and method",
            Unit::Seconds,
            m.rpc_latency.clone(),
        );
        r.register(
            "curator_forwarded_calls",
            "Calls this curator forwarded to the leader",
            m.forwarded_calls.clone(),
        );
        r.register(
            "curator_leader",
            "1 while this node's curator is the leader, else 0",
            m.curator_leader.clone(),
        );
        r.register(
            "curator_leadership_changes",
            "Times this node's curator became leader or stopped being leader",
            m.curator_leadership_changes.clone(),
        );
        r.register(
            "supervisor_runnable_restarts",
            "Restarts of a failed runnable, by runnable DN",
            m.supervisor_restarts.clone(),
        );
        top.register_collector(Box::new(m.nodes.clone()));
        top.register_collector(Box::new(m.etcd_member.clone()));
        top.register_collector(Box::new(m.heartbeat_age.clone()));
        *m.registry.lock().expect("metrics registry lock") = top;
        m
    }

    /// Adds a collector read at every scrape (e.g. the node's certificates).
    pub fn register_collector(&self, collector: Box<dyn prometheus_client::collector::Collector>) {
        self.registry
            .lock()
            .expect("metrics registry lock")
            .register_collector(collector);
    }

    /// The registry as OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        let registry = self.registry.lock().expect("metrics registry lock");
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// The registry in the Prometheus text format 0.0.4 (what `promtool check metrics`
    /// and clients without OpenMetrics read).
    pub fn encode_prometheus(&self) -> String {
        openmetrics_to_prometheus(&self.encode())
    }

    /// Counts one restart of the runnable `dn` (the supervisor's restart hook).
    pub fn runnable_restarted(&self, dn: &str) {
        self.supervisor_restarts
            .get_or_create(&[("runnable", dn.to_string())])
            .inc();
    }

    /// Sets whether this node's curator leads, counting a change.
    pub fn set_curator_leader(&self, leader: bool) {
        let old = self.curator_leader.set(i64::from(leader));
        if old != i64::from(leader) {
            self.curator_leadership_changes.inc();
        }
    }
}

/// OpenMetrics text to the Prometheus text format 0.0.4: a counter family is named
/// with its `_total` suffix (as its samples are), `# UNIT` and `# EOF` lines go.
pub fn openmetrics_to_prometheus(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut help: Option<&str> = None;
    for line in text.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        if line.starts_with("# HELP ") {
            if let Some(h) = help.replace(line) {
                out.push_str(h);
                out.push('\n');
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ")
            && let Some(name) = rest.strip_suffix(" counter")
            && !name.ends_with("_total")
        {
            if let Some(h) = help.take() {
                let text = h
                    .strip_prefix("# HELP ")
                    .and_then(|h| h.strip_prefix(name))
                    .unwrap_or("");
                out.push_str(&format!("# HELP {name}_total{text}\n"));
            }
            out.push_str(&format!("# TYPE {name}_total counter\n"));
            continue;
        }
        if let Some(h) = help.take() {
            out.push_str(h);
            out.push('\n');
        }
        out.push_str(line);
        out.push('\n');
    }
    if let Some(h) = help {
        out.push_str(h);
        out.push('\n');
    }
    out
}

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Whether this process counts and serves metrics (`polis-node --no-metrics` turns it
/// off before anything is served; the curator then adds no RPC layer).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The node's metrics (created on first use).
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_counters_and_drops_openmetrics_lines() {
        let om = "# HELP a_calls Calls.\n# TYPE a_calls counter\na_calls_total 1\n# HELP b_seconds Time.\n# TYPE b_seconds gauge\n# UNIT b_seconds seconds\nb_seconds 2\n# EOF\n";
        assert_eq!(
            openmetrics_to_prometheus(om),
            "# HELP a_calls_total Calls.\n# TYPE a_calls_total counter\na_calls_total 1\n# HELP b_seconds Time.\n# TYPE b_seconds gauge\nb_seconds 2\n"
        );
    }

    #[test]
    fn the_registry_has_every_family() {
        let m = Metrics::new();
        m.set_curator_leader(true);
        m.set_curator_leader(true);
        m.runnable_restarted("root.role");
        let text = m.encode_prometheus();
        assert!(text.contains("polis_curator_leader 1\n"), "{text}");
        assert!(
            text.contains("polis_curator_leadership_changes_total 1\n"),
            "{text}"
        );
        assert!(
            text.contains("polis_supervisor_runnable_restarts_total{runnable=\"root.role\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE process_cpu_seconds_total counter\n"),
            "{text}"
        );
        assert!(!text.contains("# EOF") && !text.contains(".."), "{text}");
    }
}
