//! Cluster mode: the nodes take turns through Redis (see
//! `crate::cluster::acme`). One orders at a time under the lock, the
//! certificates other nodes got are installed here, a failed order's
//! backoff holds for every node, and every node's plain listener answers
//! every node's challenges.

use super::board::HostStatus;
use super::storage::save;
use super::{orderable, unix_now, AcmeService, RecentOrders, MAX_BACKOFF, SHARED_CHALLENGE_POLL};
use crate::cluster::acme::AcmeRedis;
use crate::config::AcmeConfig;
use crate::tls::store::Source;
use crate::tls::Edge;
use instant_acme::Account;
use pingora::server::ShutdownWatch;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl AcmeService {
    /// Orders for `host` in this node's turn: under the cluster's lock, if
    /// the host is still due once the lock is held, the backoff of its last
    /// failed order (by any node) is over and the cluster's orders this
    /// hour allow one more.
    pub(super) async fn order_in_turn(
        &self,
        redis: &mut AcmeRedis,
        account: &Account,
        host: &str,
        config: &AcmeConfig,
        started: &mut RecentOrders,
        now: Instant,
    ) {
        // One node orders at a time; what it finds may have changed
        // while another node held the lock.
        if !redis.lock().await {
            return;
        }
        self.receive(redis, &config.storage).await;
        if self.due(host, Instant::now())
            && self.shared_backoff_over(redis, host).await
            && redis.count_order(config.orders_per_hour, unix_now()).await
        {
            started.record(now);
            self.order_one(account, host, &config.storage, Some(redis))
                .await;
        }
        redis.unlock().await;
    }

    /// Cluster mode: takes the certificates other nodes shared. One is
    /// installed under `storage/certs` (so it survives Redis being away)
    /// if its host is one ACME may order for, it covers exactly that host,
    /// and the one there is older.
    pub(super) async fn receive(&self, redis: &mut AcmeRedis, storage: &Path) {
        let Some(certs) = redis.new_certs().await else {
            return;
        };
        let Some(store) = self.edge.store.as_ref() else {
            return;
        };
        let dir = storage.join("certs");
        let issued_at = |chain: &[u8], key: &[u8], host: &str| {
            crate::tls::store::certified_key(chain, key, host, Source::Acme).map(|(_, info)| info)
        };
        let mut installed = 0;
        for cert in certs {
            // The host names a file: nothing but a DNS name gets there.
            if !orderable(&cert.host) {
                log::warn!(
                    "ACME: a certificate in Redis names no orderable host: {:?}",
                    cert.host
                );
                continue;
            }
            let theirs = match issued_at(cert.chain.as_bytes(), cert.key.as_bytes(), &cert.host) {
                Ok(info) if info.sans == [cert.host.as_str()] => info.not_before,
                Ok(info) => {
                    log::warn!(
                        "ACME: the certificate in Redis for {} covers {:?}: not installed",
                        cert.host,
                        info.sans
                    );
                    continue;
                }
                Err(e) => {
                    log::warn!("ACME: certificate for {} from Redis: {e}", cert.host);
                    continue;
                }
            };
            let crt = std::fs::read(dir.join(format!("{}.crt", cert.host)));
            let key = std::fs::read(dir.join(format!("{}.key", cert.host)));
            let ours = match (crt, key) {
                (Ok(crt), Ok(key)) => issued_at(&crt, &key, &cert.host).ok().map(|i| i.not_before),
                _ => None,
            };
            if ours.is_some_and(|t| t >= theirs) {
                continue;
            }
            match save(storage, &cert.host, &cert.chain, &cert.key) {
                Ok(()) => {
                    installed += 1;
                    self.edge.acme.set(&cert.host, HostStatus::issued());
                }
                Err(e) => log::warn!("ACME: certificate for {} from Redis: {e}", cert.host),
            }
        }
        if installed > 0 {
            log::info!("ACME: {installed} certificate(s) from other nodes installed");
            store.reload();
        }
    }

    /// Cluster mode: whether the backoff of the last failed order for
    /// `host` (by any node) is over; the board shows it either way.
    async fn shared_backoff_over(&self, redis: &mut AcmeRedis, host: &str) -> bool {
        let failure = match redis.failure(host).await {
            Ok(Some(failure)) => failure,
            Ok(None) => return true,
            // Unknown: wait rather than risk ordering in another's backoff.
            Err(()) => return false,
        };
        let now = unix_now();
        let left = backoff_left(failure.retry_at, now);
        self.edge.acme.set(
            host,
            HostStatus::failed(
                failure.failures,
                failure.last_error,
                failure.retry_at.min(now + MAX_BACKOFF.as_secs()),
                left.map(|left| Instant::now() + left),
            ),
        );
        left.is_none()
    }
}

/// Cluster mode: keeps the edge's copy of every node's challenges fresh.
pub(super) async fn read_shared_challenges(
    mut redis: AcmeRedis,
    edge: Arc<Edge>,
    mut stop: ShutdownWatch,
) {
    let mut tick = tokio::time::interval(SHARED_CHALLENGE_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if let Some(challenges) = redis.challenges().await {
            edge.set_shared_challenges(challenges);
        }
    }
}

/// How long a shared backoff ending at `retry_at` (unix seconds, read
/// from Redis) still holds at `now`: `None` once over. No node writes a
/// wait longer than [`MAX_BACKOFF`], so a longer one (a corrupt or hostile
/// value) is cut to it rather than trusted, or overflowing an `Instant`.
fn backoff_left(retry_at: u64, now: u64) -> Option<Duration> {
    (retry_at > now).then(|| Duration::from_secs(retry_at - now).min(MAX_BACKOFF))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_backoff_from_redis_never_overflows_and_never_outlasts_the_longest_wait() {
        assert_eq!(backoff_left(100, 100), None);
        assert_eq!(backoff_left(90, 100), None);
        assert_eq!(backoff_left(160, 100), Some(Duration::from_secs(60)));
        // A value no node writes: cut to the longest backoff, no panic.
        assert_eq!(backoff_left(u64::MAX, 100), Some(MAX_BACKOFF));
        let _ = Instant::now() + backoff_left(u64::MAX, 0).unwrap_or_default();
    }
}
