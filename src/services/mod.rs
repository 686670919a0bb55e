//! The background services that act on `Control` from outside the
//! request path: they sit above the proxy and `control`, and what they
//! change stays below (the router, the peers, `cluster::Shared`).
//!
//! - [`cluster`]: cluster mode's sync with Redis (DESIGN §4).
//! - [`dns`]: shard host names resolved again as they move.
//!
//! The health checker (`health`) and the state file's writer (`state`)
//! are services of this layer too, kept at their own paths.

pub mod cluster;
pub mod dns;
