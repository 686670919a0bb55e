//! Buckets that never refill (`refill_per_second: 0`, a one-off allowance),
//! or take longer than a minute to, keep their Redis key as long as they
//! are not full: for ever, or long enough for invented names to pile up.
//! As on a single node, such tenants live in a table of bounded size: the
//! sorted set `{prefix}oneoff` holds each with when it was last settled
//! (Redis' clock), and past `limits.max_tracked_tenants` the least recently
//! settled lose their key (their next request opens a new allowance, the
//! price the README states). A tenant is stamped before its key is
//! written, and taken out of the set only with its key, so no key escapes.

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
const DELETES_IN_FLIGHT: usize = 256;

/// Stamps every tenant in ARGV with Redis' time in the set KEYS[1].
const STAMP_LUA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, #ARGV do redis.call('ZADD', KEYS[1], now, ARGV[i]) end
return #ARGV
";

/// Takes out of the set KEYS[1] its least recently stamped tenants past
/// ARGV[1] entries, ARGV[2] at most, and returns them: one script, so nodes
/// trimming at once never take more than the excess between them.
const TRIM_LUA: &str = r"
local excess = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[1])
if excess <= 0 then return {} end
local gone = redis.call('ZRANGE', KEYS[1], 0, math.min(excess, tonumber(ARGV[2])) - 1)
if #gone > 0 then redis.call('ZREM', KEYS[1], unpack(gone)) end
return gone
";

pub(super) struct OneOffs {
    stamp: Script,
    trim: Script,
    trimmed_at: Instant,
}

impl Default for OneOffs {
    fn default() -> Self {
        OneOffs {
            stamp: Script::new(STAMP_LUA),
            trim: Script::new(TRIM_LUA),
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
    /// lose their key. A key that could not be deleted goes back to the
    /// set as the oldest, to go first at the next trim.
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
            let mut kept: Vec<&String> = Vec::new();
            for batch in gone.chunks(DELETES_IN_FLIGHT) {
                let Some(conn) = self.link.connection().await else {
                    kept.extend(batch);
                    continue;
                };
                let deletes = batch.iter().map(|tenant| {
                    let mut conn = conn.clone();
                    let del = redis::cmd("DEL").arg(self.tenant_key(tenant)).to_owned();
                    async move {
                        tokio::time::timeout(
                            super::conn::TIMEOUT,
                            del.query_async::<i64>(&mut conn),
                        )
                        .await
                    }
                });
                let results = futures_util::future::join_all(deletes).await;
                for (tenant, result) in batch.iter().zip(results) {
                    match result {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => {
                            kept.push(tenant);
                            self.link.failed("one-off", &e);
                        }
                        Err(_) => {
                            kept.push(tenant);
                            self.link.unreachable("one-off", &"timed out");
                        }
                    }
                }
            }
            if !kept.is_empty() {
                let mut back = redis::cmd("ZADD");
                back.arg(&key);
                for tenant in &kept {
                    back.arg(0).arg(tenant.as_str());
                }
                let _ = self.query::<i64>("one-off", &back).await;
                return;
            }
            if gone.len() < TRIM_STEP {
                return;
            }
        }
    }
}
