//! Certificates for tenant domains through ACME (RFC 8555), HTTP-01.
//!
//! Every second the service looks at the exact hosts of the domain map
//! (config and admin API alike): a host no certificate file covers, with
//! no ACME certificate or one past two thirds of its lifetime, is due. One
//! order runs at a time, at most `orders_per_hour` start in any hour, and
//! a host whose order failed waits (1 min, doubling to 6 h) before the
//! next. The challenge is answered by the plain listeners before routing
//! (the front end), the key and chain are written under
//! `acme.storage/certs/HOST.{crt,key}` and the store reloads at once, so
//! the certificate is served as soon as it is issued. Nothing is ordered
//! for a host the domain map does not hold, nor for wildcards or IPs.
//!
//! In cluster mode (see `crate::cluster::acme`) the nodes take turns: one
//! orders at a time under a lock in Redis, its challenges are published
//! there for every node's plain listener, and the certificate it gets is
//! stored there and installed by every node; a failed order's backoff and
//! `orders_per_hour` hold for the whole cluster.
//!
//! The client is instant-acme (see `Cargo.toml` for why).

mod account;
mod board;
mod order;
mod shared;
mod storage;

pub use board::{Board, HostStatus};

use super::store::Source;
use super::Edge;
use crate::cluster::acme::{AcmeRedis, LOCK_TTL};
use crate::config::ClusterConfig;
use account::AccountSlot;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The first wait after a failed order; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(60);
const MAX_BACKOFF: Duration = Duration::from_secs(6 * 3600);
/// How long one order may take (the cluster lock outlives it).
const ORDER_TIMEOUT: Duration = Duration::from_secs(120);
const _: () = assert!(LOCK_TTL.as_secs() > ORDER_TIMEOUT.as_secs() + 10);
/// Cluster mode: how often each node reads the challenges in Redis (in a
/// task of its own, so an order or a slow CA never delays it), and how long
/// a published one is given to reach every node before the CA is told to
/// validate.
const SHARED_CHALLENGE_POLL: Duration = Duration::from_millis(500);
const SHARED_CHALLENGE_WAIT: Duration = Duration::from_millis(1500);
/// How long loading or creating the account may take.
const ACCOUNT_TIMEOUT: Duration = Duration::from_secs(30);

/// The hosts the domain map serves now (ACME orders for those it may).
pub type HostList = Box<dyn Fn() -> Vec<String> + Send + Sync>;

/// The background service ordering and renewing certificates.
pub struct AcmeService {
    edge: Arc<Edge>,
    /// Cluster mode: challenges, certificates and the order lock shared.
    cluster: Option<ClusterConfig>,
    hosts: HostList,
}

impl AcmeService {
    pub fn new(edge: Arc<Edge>, cluster: Option<ClusterConfig>, hosts: HostList) -> Self {
        AcmeService {
            edge,
            cluster,
            hosts,
        }
    }
}

#[async_trait]
impl BackgroundService for AcmeService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(config) = self.edge.config.acme.clone() else {
            return;
        };
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut shared = self.cluster.clone().map(AcmeRedis::new);
        let mut account = AccountSlot::new();
        let mut started = RecentOrders::default();
        if let Some(cluster) = self.cluster.clone() {
            tokio::spawn(shared::read_shared_challenges(
                AcmeRedis::new(cluster),
                Arc::clone(&self.edge),
                shutdown.clone(),
            ));
        }
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            if let Some(redis) = &mut shared {
                self.receive(redis, &config.storage).await;
            }
            let Some(host) = self.due_host(Instant::now()) else {
                continue;
            };
            let Some(acct) = account.get(&config, &self.edge.acme).await else {
                continue;
            };
            let now = Instant::now();
            if !started.room_for_one(now, config.orders_per_hour) {
                continue;
            }
            match &mut shared {
                None => {
                    started.record(now);
                    self.order_one(acct, &host, &config.storage, None).await;
                }
                Some(redis) => {
                    self.order_in_turn(redis, acct, &host, &config, &mut started, now)
                        .await
                }
            }
        }
    }
}

/// The orders this node started in the last hour, for `orders_per_hour`.
#[derive(Default)]
struct RecentOrders(VecDeque<Instant>);

impl RecentOrders {
    /// Whether fewer than `per_hour` orders started in the hour before
    /// `now` (older ones are forgotten).
    fn room_for_one(&mut self, now: Instant, per_hour: u32) -> bool {
        while self
            .0
            .front()
            .is_some_and(|t| now - *t > Duration::from_secs(3600))
        {
            self.0.pop_front();
        }
        self.0.len() < per_hour as usize
    }

    fn record(&mut self, at: Instant) {
        self.0.push_back(at);
    }
}

impl AcmeService {
    /// The first host that needs a certificate now, if any; hosts ACME no
    /// longer serves leave the board.
    fn due_host(&self, now: Instant) -> Option<String> {
        let wanted: Vec<String> = (self.hosts)()
            .into_iter()
            .filter(|h| orderable(h))
            .collect();
        self.edge.acme.keep_only(&wanted);
        wanted.into_iter().find(|host| self.due(host, now))
    }

    /// Whether `host` needs a certificate now: none covers it, or ACME's
    /// is past two thirds of its life, and it is not backing off.
    fn due(&self, host: &str, now: Instant) -> bool {
        let Some(store) = self.edge.store.as_ref() else {
            return false;
        };
        let fresh = match store.covering(host) {
            Some(c) if c.source == Source::File => true,
            Some(c) => {
                let life = (c.expires - c.not_before).max(0);
                (unix_now() as i64) < c.not_before + life * 2 / 3
            }
            None => false,
        };
        !fresh && !self.edge.acme.waiting(host, now)
    }
}

/// Whether ACME may order for `host`: a DNS name with at least two labels
/// (no wildcard, no IP, no port).
fn orderable(host: &str) -> bool {
    host.len() <= 253
        && host.contains('.')
        && host.parse::<std::net::IpAddr>().is_err()
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
