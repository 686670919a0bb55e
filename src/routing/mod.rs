//! The routing core: pure decisions with no I/O and no Pingora types, behind
//! an injectable clock. It follows `@absolutejs/router` to the fine points
//! (decision order, token math, cursors, placement hashes), so tenants keep
//! their shard when a platform moves from it to shardgate.

pub mod balance;
pub mod clock;
mod decision;
pub mod domain;
pub mod hash;
pub mod region;
mod router;
mod shard;
mod snapshot;
pub mod top;

pub use crate::counters;

pub use balance::Balance;
pub use clock::{Clock, ManualClock, MonotonicClock};
pub use decision::{Decision, RouteRequest, RouteResult};
pub use domain::{DomainError, DomainMap, DomainMatch, Fallback, Resolved};
pub use hash::{CustomHash, RoutingKey};
pub use region::{Region, RegionDirectory, RegionError};
pub use router::{AllowHook, HashStrategy, Load, LoadHook, Router, RouterMetrics, RouterOptions};
pub use shard::{Shard, ShardEntry, ShardId, ShardProtocol, ShardSet, ShardStatus};
pub use snapshot::{
    ClientBucketSnapshot, RouteBucketSnapshot, RouterSnapshot, ShardSnapshot, TenantSnapshot,
    Tokens,
};
pub use top::{TopRefused, TopTenant};
