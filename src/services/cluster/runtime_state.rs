//! The runtime state nodes share (shards, domains, denies, drains made
//! through the admin API): every 200 ms this node writes its changes, a
//! field at a time with a version bump, and reads the whole hash when the
//! version moved.

use super::service::Syncer;
use crate::cluster::conn::{text_pairs, Raw};

/// Sets one field of the shared state and bumps its version (a version
/// some other writer damaged starts again at 1: any change is news).
pub(super) const STATE_PUT_LUA: &str = r"
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local v = redis.pcall('INCR', KEYS[2])
if type(v) ~= 'number' then
  redis.call('DEL', KEYS[2])
  v = redis.call('INCR', KEYS[2])
end
return v
";

impl Syncer {
    /// Writes this node's runtime changes, keeps the region assignments in
    /// step (`regions.rs`), and applies what other nodes changed.
    pub(super) async fn exchange_state(&mut self) {
        self.after_loss();
        if !self.shared().redis_up() {
            return;
        }
        let state = self.key("{state}");
        let version = self.key("{state}:v");
        let pending = self.shared().take_pending();
        for (i, (field, value)) in pending.iter().enumerate() {
            let mut put = self.state_script.key(&state);
            put.key(&version).arg(field).arg(value);
            if self.link.invoke::<i64>("state", &put).await.is_none() {
                self.shared().requeue_pending(pending[i..].to_vec());
                return;
            }
        }
        if !self.sync_regions(self.state_version.is_none()).await {
            return;
        }
        // Compared as it is read: any change of the value is news.
        let get = redis::cmd("GET").arg(&version).to_owned();
        let Some(v) = self.query::<Option<Vec<u8>>>("state", &get).await else {
            return;
        };
        let Some(v) = v else {
            // No version: Redis is new or lost its data. Put back what
            // this node knows, so nodes that start later get it.
            self.shared().republish_known();
            self.state_version = Some(Vec::new());
            return;
        };
        if self.state_version.as_ref() == Some(&v) {
            return;
        }
        let read = redis::cmd("HGETALL").arg(&state).to_owned();
        let Some(all) = self.query::<Raw>("state", &read).await else {
            return;
        };
        // Shards first (what else refers to them), their names resolved
        // side by side: one slow name delays the others by nothing.
        let (shards, rest): (Vec<_>, Vec<_>) = (self.shared().news(text_pairs(all).collect()))
            .into_iter()
            .partition(|(field, _)| field.starts_with("shard:"));
        let control = &self.control;
        let added = shards.iter().map(|(f, v)| control.apply_shared(f, v));
        futures_util::future::join_all(added).await;
        for (field, value) in rest {
            self.control.apply_shared(&field, &value).await;
        }
        self.state_version = Some(v);
    }
}
