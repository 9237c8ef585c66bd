//! Launching real Polis processes for tests and benchmarks.
//!
//! Nothing here is a stand-in: [`Node`] runs the `polis-node` binary (which runs Debian's
//! etcd), [`BareEtcd`] runs etcd itself with the flags polis-node would use, and
//! [`polisctl`] runs the CLI. Binaries are found next to the test executable's target
//! directory, so `cargo build --workspace` must have built them.
//!
//! Invariants:
//! - Every process started here is killed when its guard is dropped, also when a test
//!   panics; polis-node's etcd dies with it (`PR_SET_PDEATHSIG`).
//! - Nodes listen only on unique 127.0.0.0/8 addresses ([`unique_loopback`]), so tests
//!   can run in parallel, or on 10.77.0.0/24 inside namespaces a [`Partition`] created.
//! - Waiting is polling with a deadline; nothing sleeps and hopes.
//!
//! Module map, by layer (a module imports only from layers below it):
//!
//! ```text
//!   4  partitioned PartitionedCluster: 3 members (+ worker) in a Partition's
//!                namespaces, owner in the hub; leader(), write(), is_back()
//!   3  cluster   Cluster: bootstrap + takeownership, register/approve/add_worker,
//!                owner client, node list and member polls; endpoints(),
//!                write_label()
//!   2  node      Node: params, start (crash points), log progress (Home, state,
//!                curator), etcdctl on its socket; is_home_line()
//!      etcd      BareEtcd: etcd alone, with polis-node's flags and peer TLS files
//!      scrape_bench  scrape_members(): every member's /metrics timed (bench-heartbeats
//!                --scrape, `scripts/bench metrics`)
//!   1  ctl       polisctl(): the CLI wrapper; copy_config()
//!      impostor  Impostor: a TLS server presenting a given certificate (posing as a
//!                curator), stopped on drop
//!      scrape    http_get(), scrape() of /metrics, promtool_check(), Prometheus server
//!   0  process   Proc (killed on drop), bin(), bin_dir(), process_alive()
//!      net       unique_loopback(), NetNs (deleted on drop)
//!      wait      TIMEOUT, wait_until()
//!      certs     pem_der(), peer_accepts()
//!      sim       simulated nodes: sim_address(), register_ticket(), enrol_at() (the
//!                real enrolment flow for a key of the bench's own)
//!      bench     median(), seconds_and_rounds(), timed_calls() (the API benches'
//!                client loop) → Calls
//!      floor     Floor: the least a curator write costs (the curator's transport and
//!                its transaction shape, nothing else), for `scripts/bench api`
//!      datadev   fscrypt_usable(), data_image(), Mounts (unmounts on drop)
//!      partition Partition: hub bridge + a namespace per node, cut (both ways /
//!                outgoing only), heal, enter_hub(); all deleted on drop
//! ```
//!
//! Everything tests and benchmarks use is re-exported here (`e2e::Node`, `e2e::TIMEOUT`,
//! …); the modules themselves are private.

mod bench;
mod certs;
mod cluster;
mod ctl;
mod datadev;
mod etcd;
mod floor;
mod impostor;
mod kube;
mod net;
mod node;
mod partition;
mod partitioned;
mod process;
mod scrape;
mod scrape_bench;
mod sim;
mod wait;

pub use bench::{Calls, cpu_time, median, seconds_and_rounds, timed_calls};
pub use certs::{peer_accepts, pem_der};
pub use cluster::{Cluster, endpoints, write_label, write_labels};
pub use ctl::{copy_config, polisctl};
pub use datadev::{Mounts, data_image, fscrypt_usable};
pub use etcd::BareEtcd;
pub use floor::{Floor, curator_shaped_txn, floor_write};
pub use impostor::Impostor;
pub use kube::{kubectl, kubernetes_credentials, kubernetes_proxy, program_folder};
pub use net::{NetNs, unique_loopback};
pub use node::{Node, etcd_kv_calls_at, is_home_line, read_register_params};
pub use partition::{HubGuard, Partition, Slot};
pub use partitioned::{MEMBERS, PartitionedCluster};
pub use process::{Proc, bin, bin_dir, process_alive};
pub use scrape::{METRICS_PORT, Prometheus, http_get, promtool_check, scrape};
pub use scrape_bench::scrape_members;
pub use sim::{Enrolment, enrol_at, register_ticket, sim_address};
pub use wait::{TIMEOUT, wait_until};
