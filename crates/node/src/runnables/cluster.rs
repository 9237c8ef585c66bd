//! The cluster manager: carries out the start decision and hands the result to the
//! role server.
//!
//! ```text
//!   preflight ─────────Plan──▶ cluster manager ──Membership──▶ role server / controlplane
//!                                     │                              │
//!                                     └──── logs every change of ◀───┘ ClusterState
//! ```
//! Bootstrap prepares everything etcd needs to start (see `bootstrap`); the
//! sealed configuration is only written by the control plane once the cluster records
//! are in etcd. Register (see `register`) runs here to its end (approval may take
//! hours) and then hands the role server the same data a join would. A join was loaded
//! and checked in preflight already.
//!
//! The decision is carried out once per start: may not retry a failed start path, and
//! may not start any service (the role server does, once `NodeValues::membership` is set).

use std::net::IpAddr;
use std::sync::Arc;

use crate::disk::storage::Root;
use crate::process::fatal::FatalSender;
use crate::start::preflight::Plan;
use crate::start::{bootstrap, register};
use crate::state::membership::{Membership, initial_curators};
use crate::state::values::NodeValues;

/// The `root.cluster` runnable body: carry out the plan, then log cluster state changes.
pub async fn run(
    ctx: supervisor::Context,
    root: Root,
    address: IpAddr,
    plan: Plan,
    values: NodeValues,
    fatal: FatalSender,
) -> supervisor::RunnableResult {
    // Logged from a runnable of its own: registration keeps this one busy for as long
    // as the owner takes to approve, and its states must show meanwhile.
    let logged = values.cluster_state.clone();
    ctx.run("state", move |ctx| {
        let mut state = logged.watch();
        async move {
            ctx.signal_healthy();
            loop {
                tokio::select! {
                    s = state.get() => match s {
                        Ok(s) => tracing::info!(cluster_state = %s, "cluster state changed"),
                        Err(_) => return Ok(()),
                    },
                    _ = ctx.cancelled() => return Ok(()),
                }
            }
        }
    })?;
    if values.membership.current().is_none() {
        let membership = match plan {
            Plan::Bootstrap(p) => {
                bootstrap::prepare(&root, address, p).map(|b| Membership::Bootstrap(Arc::new(b)))
            }
            Plan::Register(params, what) => {
                match register::register(
                    &ctx,
                    &root,
                    address,
                    &params,
                    &what,
                    &values.cluster_state,
                )
                .await
                {
                    Ok(Some(j)) => Ok(Membership::Join(Arc::new(j))),
                    Ok(None) => return Ok(()),
                    Err(e) => Err(e),
                }
            }
            Plan::Join(j) => Ok(Membership::Join(j)),
        };
        match membership {
            Ok(m) => {
                values.curators.set(initial_curators(&m, address));
                values.roles.set(m.roles());
                values.membership.set(m);
            }
            Err(e) => {
                // The decision is once per start: a failed attempt is not retried.
                let _ = fatal.send(e.context("cluster manager"));
                ctx.signal_done();
                return Ok(());
            }
        }
    }
    ctx.signal_healthy();
    ctx.cancelled().await;
    Ok(())
}
