//! Membership edits: health, draining, shards added and removed. Each
//! edit is made under the membership lock and published as a new
//! immutable snapshot for the request path to read.

use super::Router;
use crate::routing::shard::{Membership, Shard, ShardSet, ShardStatus};
use std::sync::Arc;

impl Router {
    /// Edits membership under its lock and publishes the result.
    pub(super) fn edit_membership<R>(&self, f: impl FnOnce(&mut Membership) -> R) -> R {
        let mut m = self.membership.lock();
        let r = f(&mut m);
        self.shards.store(Arc::new(m.publish()));
        r
    }

    fn edit_status(&self, id: &str, f: impl FnOnce(&mut ShardStatus)) -> bool {
        self.edit_membership(|m| match m.status_mut(id) {
            Some(status) => {
                f(status);
                true
            }
            None => false,
        })
    }

    /// Healthy again; also ends draining. `false` for an unknown id.
    pub fn mark_healthy(&self, id: &str) -> bool {
        self.edit_status(id, |s| {
            *s = ShardStatus {
                healthy: true,
                draining: false,
            }
        })
    }

    /// Unhealthy; draining is left as it is. `false` for an unknown id.
    pub fn mark_unhealthy(&self, id: &str) -> bool {
        self.edit_status(id, |s| s.healthy = false)
    }

    /// Healthy from a probe's point of view: draining (the operator's
    /// decision) is kept.
    pub fn set_probed_health(&self, id: &str, healthy: bool) -> bool {
        self.edit_status(id, |s| s.healthy = healthy)
    }

    /// No new routes to the shard; in-flight ones finish. `false` for an
    /// unknown id.
    pub fn drain(&self, id: &str) -> bool {
        self.edit_status(id, |s| s.draining = true)
    }

    /// Appends a shard, healthy; `false` (and no change) if the id exists.
    pub fn add_shard(&self, shard: Shard) -> bool {
        self.edit_membership(|m| m.add(shard))
    }

    /// `false` if no such shard was registered.
    pub fn remove_shard(&self, id: &str) -> bool {
        self.edit_membership(|m| m.remove(id))
    }

    /// Registered shards in registration order, with their status.
    pub fn shards(&self) -> Vec<(Shard, ShardStatus, i64)> {
        self.shards
            .load()
            .all
            .iter()
            .map(|e| (Shard::clone(&e.shard), e.status, e.active()))
            .collect()
    }

    /// The current membership snapshot (what the next request routes over).
    pub fn shard_set(&self) -> Arc<ShardSet> {
        self.shards.load_full()
    }

    pub fn shard_status(&self, id: &str) -> Option<ShardStatus> {
        self.membership.lock().status(id)
    }

    pub fn is_healthy(&self, id: &str) -> bool {
        self.shard_status(id).is_some_and(|s| s.healthy)
    }

    pub fn is_draining(&self, id: &str) -> bool {
        self.shard_status(id).is_some_and(|s| s.draining)
    }
}
