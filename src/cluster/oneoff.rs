//! Buckets that never refill (`refill_per_second: 0`, a one-off allowance)
//! are never full again, so their Redis keys cannot expire as the others
//! do. As on a single node, they live in a table of bounded size: the
//! sorted set `{prefix}oneoff` holds each such tenant with when it was
//! last settled, and past `limits.max_tracked_tenants` the least recently
//! settled lose their key (their next request opens a new allowance, the
//! price the README states).

use super::service::Syncer;
use compact_str::CompactString;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often the set is trimmed, and how many keys one trim drops at most.
const TRIM_EVERY: Duration = Duration::from_secs(1);
const TRIM_AT_MOST: usize = 10_000;
const DELETES_IN_FLIGHT: usize = 256;

impl Syncer {
    /// Stamps the one-off tenants just settled and, once a second, drops
    /// the least recently settled past the bound.
    pub(super) async fn bound_one_offs(&mut self, settled: Vec<CompactString>) {
        let limits = self.control.router.limits();
        let one_off = |rule: &crate::limits::RateRule| {
            !rule.is_unlimited() && rule.refill_per_second <= 0.0
        };
        if !one_off(limits.rate()) && !limits.routes().any(|(_, rule)| one_off(rule)) {
            return;
        }
        let key = self.key("oneoff");
        if !settled.is_empty() {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let mut add = redis::cmd("ZADD");
            add.arg(&key);
            for tenant in &settled {
                add.arg(now).arg(tenant.as_str());
            }
            if self.query::<i64>("one-off", &add).await.is_none() {
                return;
            }
        }
        if self.one_offs_trimmed_at.elapsed() < TRIM_EVERY {
            return;
        }
        self.one_offs_trimmed_at = Instant::now();
        let count = redis::cmd("ZCARD").arg(&key).to_owned();
        let Some(count) = self.query::<usize>("one-off", &count).await else {
            return;
        };
        let bound = self.control.config.limits.max_tracked_tenants;
        if count <= bound {
            return;
        }
        let pop = redis::cmd("ZPOPMIN")
            .arg(&key)
            .arg((count - bound).min(TRIM_AT_MOST))
            .to_owned();
        let Some(gone) = self.query::<Vec<(String, f64)>>("one-off", &pop).await else {
            return;
        };
        for batch in gone.chunks(DELETES_IN_FLIGHT) {
            let Some(conn) = self.link.connection().await else {
                return;
            };
            let deletes = batch.iter().map(|(tenant, _)| {
                let mut conn = conn.clone();
                let del = redis::cmd("DEL").arg(self.tenant_key(tenant)).to_owned();
                async move {
                    tokio::time::timeout(super::conn::TIMEOUT, del.query_async::<i64>(&mut conn))
                        .await
                }
            });
            for result in futures_util::future::join_all(deletes).await {
                match result {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => self.link.failed("one-off", &e),
                    Err(_) => self.link.unreachable("one-off", &"timed out"),
                }
            }
        }
    }
}
