//! The start paths: what happens once per start, before and while the node becomes a
//! member of its cluster.
//!
//! ```text
//!   preflight ──▶ decision (pure) ──▶ Plan ──▶ cluster manager carries it out:
//!                     │                         bootstrap::prepare (then the control
//!                     │                           plane runs bootstrap::finish)
//!                     │                         register::register
//!                     └─ reads bootstrap::trace, join::prepare
//! ```
//! Start paths use the leaf modules only (and each other, downwards: preflight uses
//! decision, bootstrap and join); they may not import the runnables or the role server.

pub mod bootstrap;
pub mod decision;
pub mod join;
pub mod preflight;
pub mod register;
