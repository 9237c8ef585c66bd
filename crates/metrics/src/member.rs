//! This node's etcd member as the curator last sampled it, exported only while there is
//! a sample (a worker runs no etcd and exports none of these families).
//!
//! Holds the last sample only; may not take one.

use std::sync::Mutex;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// What the local member says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberSample {
    pub db_size_bytes: i64,
    pub db_size_in_use_bytes: i64,
    pub raft_index: u64,
    pub learner: bool,
    pub leader_id: u64,
}

#[derive(Debug, Default)]
struct State {
    last: Option<MemberSample>,
    leader_changes: u64,
}

/// The member's families: the last sample, and the leader changes seen between samples.
#[derive(Debug, Default)]
pub struct EtcdMember(Mutex<State>);

impl EtcdMember {
    /// Records a sample; a change of a known leader to another counts one leader change.
    pub fn sample(&self, sample: MemberSample) {
        let mut state = self.0.lock().expect("etcd member metrics lock");
        let before = state.last.map_or(0, |s| s.leader_id);
        if before != 0 && sample.leader_id != 0 && sample.leader_id != before {
            state.leader_changes += 1;
        }
        let leader_id = if sample.leader_id == 0 {
            before
        } else {
            sample.leader_id
        };
        state.last = Some(MemberSample {
            leader_id,
            ..sample
        });
    }

    /// This node runs no etcd member any more: its families disappear.
    pub fn clear(&self) {
        self.0.lock().expect("etcd member metrics lock").last = None;
    }
}

impl Collector for EtcdMember {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let state = self.0.lock().expect("etcd member metrics lock");
        let Some(s) = state.last else {
            return Ok(());
        };
        let gauges = [
            (
                "polis_etcd_db_size_bytes",
                "Size of this node's etcd member database file",
                s.db_size_bytes,
            ),
            (
                "polis_etcd_db_size_in_use_bytes",
                "Bytes of this node's etcd member database in use",
                s.db_size_in_use_bytes,
            ),
            (
                "polis_etcd_raft_index",
                "Raft index of this node's etcd member",
                s.raft_index as i64,
            ),
            (
                "polis_etcd_learner",
                "1 while this node's etcd member is a learner, 0 while it is a voter",
                i64::from(s.learner),
            ),
        ];
        for (name, help, value) in gauges {
            let g = ConstGauge::new(value);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        let c = ConstCounter::new(state.leader_changes);
        c.encode(encoder.encode_descriptor(
            "polis_etcd_leader_changes",
            "etcd leader changes this node's member was seen to follow since the node started",
            None,
            c.metric_type(),
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    fn text(m: EtcdMember) -> (String, std::sync::Arc<EtcdMember>) {
        let m = std::sync::Arc::new(m);
        let mut r = Registry::default();
        r.register_collector(Box::new(m.clone()));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        (out, m)
    }

    #[test]
    fn nothing_before_a_sample_then_counts_leader_changes() {
        let (out, _) = text(EtcdMember::default());
        assert_eq!(out, "# EOF\n");
        let m = EtcdMember::default();
        let s = MemberSample {
            db_size_bytes: 100,
            db_size_in_use_bytes: 50,
            raft_index: 7,
            learner: false,
            leader_id: 1,
        };
        m.sample(s);
        m.sample(MemberSample { leader_id: 0, ..s }); // no leader known: no change
        m.sample(MemberSample { leader_id: 1, ..s });
        m.sample(MemberSample { leader_id: 2, ..s });
        let (out, m) = text(m);
        assert!(out.contains("polis_etcd_db_size_bytes 100\n"), "{out}");
        assert!(out.contains("polis_etcd_learner 0\n"), "{out}");
        assert!(out.contains("polis_etcd_leader_changes_total 1\n"), "{out}");
        m.clear();
        let mut r = Registry::default();
        r.register_collector(Box::new(m));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        assert_eq!(out, "# EOF\n");
    }
}
