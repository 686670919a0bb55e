//! Buckets that never refill (`refill_per_second: 0`, a one-off allowance),
//! or take longer than a minute to, keep their Redis key as long as they
//! are not full: for ever, or long enough for invented names to pile up.
//! As on a single node, such tenants live in a table of bounded size: the
//! sorted set `{prefix}oneoff` holds each with when it was last settled
//! (Redis' clock), and past `limits.max_tracked_tenants` the least recently
//! settled lose their key (their next request opens a new allowance, the
//! price the README states). A tenant is stamped before its key is
//! written, and leaves the set only once its key is gone, so no key
//! escapes: a trim first claims the tenants it takes (a negative score:
//! the claim's time), deletes their keys, then removes the claims still
//! standing; a claim a failure left (Redis lost mid-trim, the node gone)
//! is taken again by the next trim once stale.

use super::service::Syncer;
use compact_str::CompactString;
use redis::Script;
use std::time::{Duration, Instant};

/// How often the set is trimmed, how many tenants one trim script takes
/// out (Lua's `unpack` stays well under its stack), and how many scripts
/// one trim runs at most.
const TRIM_EVERY: Duration = Duration::from_secs(1);
const TRIM_STEP: usize = 1000;
const TRIM_STEPS: usize = 20;

/// Stamps every tenant in ARGV with Redis' time in the set KEYS[1].
const STAMP_LUA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, #ARGV do redis.call('ZADD', KEYS[1], now, ARGV[i]) end
return #ARGV
";

/// Claims in the set KEYS[1] (scores them minus Redis' time) and returns,
/// ARGV[2] at most: first claims older than 10 s (a trim that failed
/// midway: a deletion takes at most a second), then the least recently
/// stamped tenants past ARGV[1] unclaimed entries. One script, so nodes
/// trimming at once never take more than the excess between them. A
/// tenant stamped again (settled) is unclaimed by that.
const TRIM_LUA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local step = tonumber(ARGV[2])
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. (10000 - now), '(0', 'LIMIT', 0, step)
local claimed = redis.call('ZCOUNT', KEYS[1], '-inf', '(0')
local excess = redis.call('ZCARD', KEYS[1]) - claimed - tonumber(ARGV[1])
local room = math.min(excess, step - #gone)
if room > 0 then
  local oldest = redis.call('ZRANGEBYSCORE', KEYS[1], 0, '+inf', 'LIMIT', 0, room)
  for i = 1, #oldest do gone[#gone + 1] = oldest[i] end
end
for i = 1, #gone do redis.call('ZADD', KEYS[1], -now, gone[i]) end
return gone
";

/// Removes from the set KEYS[1] the tenants in ARGV still claimed (their
/// keys are gone; one stamped since stays).
const DONE_LUA: &str = r"
local n = 0
for i = 1, #ARGV do
  local score = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[i]))
  if score and score < 0 then n = n + redis.call('ZREM', KEYS[1], ARGV[i]) end
end
return n
";

pub(super) struct OneOffs {
    stamp: Script,
    trim: Script,
    done: Script,
    trimmed_at: Instant,
}

impl Default for OneOffs {
    fn default() -> Self {
        OneOffs {
            stamp: Script::new(STAMP_LUA),
            trim: Script::new(TRIM_LUA),
            done: Script::new(DONE_LUA),
            trimmed_at: Instant::now(),
        }
    }
}

impl Syncer {
    /// Stamps the tenants about to be settled whose buckets last; `false`
    /// if Redis did not take it (they are not settled this time).
    pub(super) async fn stamp_lasting(&mut self, tenants: &[CompactString]) -> bool {
        if tenants.is_empty() {
            return true;
        }
        let mut invocation = self.one_offs.stamp.key(self.key("oneoff"));
        for tenant in tenants {
            invocation.arg(tenant.as_str());
        }
        self.link
            .invoke::<i64>("one-off", &invocation)
            .await
            .is_some()
    }

    /// Once a second: the least recently settled tenants past the bound
    /// lose their key, then leave the set. A key that could not be deleted
    /// keeps its claim, taken again once stale.
    pub(super) async fn trim_lasting(&mut self) {
        if self.one_offs.trimmed_at.elapsed() < TRIM_EVERY {
            return;
        }
        self.one_offs.trimmed_at = Instant::now();
        let key = self.key("oneoff");
        let bound = self.control.config.limits.max_tracked_tenants;
        for _ in 0..TRIM_STEPS {
            let mut invocation = self.one_offs.trim.key(&key);
            invocation.arg(bound).arg(TRIM_STEP);
            let Some(gone) = self
                .link
                .invoke::<Vec<String>>("one-off", &invocation)
                .await
            else {
                return;
            };
            let keys: Vec<String> = gone.iter().map(|t| self.tenant_key(t)).collect();
            let deleted = (self.link)
                .each("one-off", &keys, |key, mut conn| {
                    let del = redis::cmd("DEL").arg(key).to_owned();
                    async move { del.query_async::<i64>(&mut conn).await }
                })
                .await;
            let done: Vec<&String> = (gone.iter().zip(&deleted))
                .filter(|(_, d)| d.is_some())
                .map(|(t, _)| t)
                .collect();
            if !done.is_empty() {
                let mut invocation = self.one_offs.done.key(&key);
                for tenant in &done {
                    invocation.arg(tenant.as_str());
                }
                let _ = self.link.invoke::<i64>("one-off", &invocation).await;
            }
            if done.len() < gone.len() || gone.len() < TRIM_STEP {
                return;
            }
        }
    }
}
