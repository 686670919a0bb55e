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

use super::store::Source;
use super::Edge;
use crate::cluster::acme::{AcmeRedis, Failure as SharedFailure, LOCK_TTL};
use crate::config::ClusterConfig;
use async_trait::async_trait;
use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};
use parking_lot::Mutex;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// Where ACME stands for one host, as `GET /v1/certs` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct HostStatus {
    /// `ordering`, `issued` or `failed`.
    pub state: &'static str,
    /// Failed orders in a row.
    pub failures: u32,
    pub last_error: Option<String>,
    /// Unix seconds: when a failed host is tried again.
    pub retry_at: Option<u64>,
    #[serde(skip)]
    retry_instant: Option<Instant>,
}

impl HostStatus {
    fn issued() -> Self {
        HostStatus {
            state: "issued",
            failures: 0,
            last_error: None,
            retry_at: None,
            retry_instant: None,
        }
    }
}

/// What ACME is doing, for the admin API and the metrics.
#[derive(Default)]
pub struct Board {
    hosts: Mutex<BTreeMap<String, HostStatus>>,
    /// The account could not be loaded or created (the last error).
    pub account_error: Mutex<Option<String>>,
    pub issued: AtomicU64,
    pub failed: AtomicU64,
}

impl Board {
    /// Every host ACME has worked on, by name.
    pub fn hosts(&self) -> BTreeMap<String, HostStatus> {
        self.hosts.lock().clone()
    }

    fn set(&self, host: &str, status: HostStatus) {
        self.hosts.lock().insert(host.to_string(), status);
    }

    fn waiting(&self, host: &str, now: Instant) -> bool {
        self.hosts
            .lock()
            .get(host)
            .and_then(|s| s.retry_instant)
            .is_some_and(|at| at > now)
    }
}

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
        let mut account = None;
        let mut account_retry = Instant::now();
        let mut account_backoff = Duration::from_secs(5);
        let mut started: VecDeque<Instant> = VecDeque::new();
        if let Some(cluster) = self.cluster.clone() {
            tokio::spawn(read_shared_challenges(
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
            if account.is_none() {
                if Instant::now() < account_retry {
                    continue;
                }
                let loaded = tokio::time::timeout(ACCOUNT_TIMEOUT, load_account(&config))
                    .await
                    .unwrap_or_else(|_| Err("the ACME server did not answer in time".to_string()));
                match loaded {
                    Ok(a) => {
                        *self.edge.acme.account_error.lock() = None;
                        account = Some(a);
                    }
                    Err(e) => {
                        log::error!("ACME account at {}: {e}", config.directory);
                        *self.edge.acme.account_error.lock() = Some(e);
                        account_retry = Instant::now() + account_backoff;
                        account_backoff = (account_backoff * 2).min(Duration::from_secs(600));
                        continue;
                    }
                }
            }
            let Some(acct) = &account else { continue };
            let now = Instant::now();
            while started
                .front()
                .is_some_and(|t| now - *t > Duration::from_secs(3600))
            {
                started.pop_front();
            }
            if started.len() >= config.orders_per_hour as usize {
                continue;
            }
            let Some(redis) = &mut shared else {
                started.push_back(now);
                self.order_one(acct, &host, &config.storage, None).await;
                continue;
            };
            // One node orders at a time; what it finds may have changed
            // while another node held the lock.
            if !redis.lock().await {
                continue;
            }
            self.receive(redis, &config.storage).await;
            if self.due(&host, Instant::now())
                && self.shared_backoff_over(redis, &host).await
                && redis.count_order(config.orders_per_hour, unix_now()).await
            {
                started.push_back(now);
                self.order_one(acct, &host, &config.storage, Some(redis))
                    .await;
            }
            redis.unlock().await;
        }
    }
}

impl AcmeService {
    /// Cluster mode: takes the certificates other nodes shared. One is
    /// installed under `storage/certs` (so it survives Redis being away)
    /// if its host is one ACME may order for, it covers exactly that host,
    /// and the one there is older.
    async fn receive(&self, redis: &mut AcmeRedis, storage: &Path) {
        let Some(certs) = redis.new_certs().await else {
            return;
        };
        let Some(store) = self.edge.store.as_ref() else {
            return;
        };
        let dir = storage.join("certs");
        let issued_at = |chain: &[u8], key: &[u8], host: &str| {
            super::store::certified_key(chain, key, host, Source::Acme).map(|(_, info)| info)
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
            HostStatus {
                state: "failed",
                failures: failure.failures,
                last_error: Some(failure.last_error),
                retry_at: Some(failure.retry_at.min(now + MAX_BACKOFF.as_secs())),
                retry_instant: left.map(|left| Instant::now() + left),
            },
        );
        left.is_none()
    }

    /// The first host that needs a certificate now, if any; hosts ACME no
    /// longer serves leave the board.
    fn due_host(&self, now: Instant) -> Option<String> {
        let wanted: Vec<String> = (self.hosts)()
            .into_iter()
            .filter(|h| orderable(h))
            .collect();
        self.edge
            .acme
            .hosts
            .lock()
            .retain(|h, _| wanted.iter().any(|w| w == h));
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

    /// Orders, validates and installs a certificate for `host`.
    async fn order_one(
        &self,
        account: &Account,
        host: &str,
        storage: &Path,
        mut shared: Option<&mut AcmeRedis>,
    ) {
        let board = &self.edge.acme;
        let failures = board.hosts.lock().get(host).map_or(0, |s| s.failures);
        board.set(
            host,
            HostStatus {
                state: "ordering",
                failures,
                last_error: None,
                retry_at: None,
                retry_instant: None,
            },
        );
        log::info!("ACME: ordering a certificate for {host}");
        let mut tokens = Vec::new();
        let result = tokio::time::timeout(
            ORDER_TIMEOUT,
            self.issue(account, host, &mut tokens, shared.as_deref_mut()),
        )
        .await
        .unwrap_or_else(|_| Err("the order did not finish within 120 s".to_string()));
        for token in &tokens {
            self.edge.withdraw_challenge(token);
            if let Some(redis) = shared.as_deref_mut() {
                redis.withdraw_challenge(token).await;
            }
        }
        // Other nodes get the certificate through Redis (read back from
        // disk: `save` checked it).
        let result = match (result, shared.as_deref_mut()) {
            (Ok((chain, key)), Some(redis)) => {
                let saved = save(storage, host, &chain, &key);
                if !redis.still_locked().await {
                    log::warn!("ACME: the ordering lock expired during the order for {host}; another node may have ordered it too");
                }
                if saved.is_ok() && !redis.put_cert(host, &chain, &key).await {
                    log::warn!("ACME: the certificate for {host} could not be shared through Redis; other nodes order it again");
                }
                saved.map(|()| None)
            }
            (Ok(pair), None) => Ok(Some(pair)),
            (Err(e), _) => Err(e),
        };
        let result = result.and_then(|pair| match pair {
            Some((chain, key)) => save(storage, host, &chain, &key),
            None => Ok(()),
        });
        // Served, or a failure (with its backoff): a certificate issued but
        // not served must not be ordered again every second.
        let result = result.and_then(|()| {
            let store = self.edge.store.as_ref().ok_or("no certificate store")?;
            store.reload();
            match store.covering(host) {
                Some(c) if c.source == Source::Acme && c.expires > unix_now() as i64 => Ok(()),
                _ => Err(format!(
                    "the certificate issued for {host} is not served (see GET /v1/certs errors)"
                )),
            }
        });
        match result {
            Ok(()) => {
                if let Some(redis) = shared {
                    redis.clear_failure(host).await;
                }
                board.issued.fetch_add(1, Ordering::Relaxed);
                log::info!("ACME: certificate for {host} issued and served");
                board.set(host, HostStatus::issued());
            }
            Err(e) => {
                board.failed.fetch_add(1, Ordering::Relaxed);
                let wait = FIRST_BACKOFF
                    .saturating_mul(1 << failures.min(16))
                    .min(MAX_BACKOFF);
                log::warn!("ACME: order for {host} failed ({e}); next try in {wait:?}");
                if let Some(redis) = shared {
                    let failure = SharedFailure {
                        failures: failures.saturating_add(1),
                        last_error: e.clone(),
                        retry_at: unix_now() + wait.as_secs(),
                    };
                    redis.set_failure(host, &failure, wait).await;
                }
                board.set(
                    host,
                    HostStatus {
                        state: "failed",
                        failures: failures.saturating_add(1),
                        last_error: Some(e),
                        retry_at: Some(unix_now() + wait.as_secs()),
                        retry_instant: Some(Instant::now() + wait),
                    },
                );
            }
        }
    }

    /// The order itself: the chain and key (PEM). The HTTP-01 tokens it
    /// published are pushed to `tokens`, for the caller to withdraw.
    async fn issue(
        &self,
        account: &Account,
        host: &str,
        tokens: &mut Vec<String>,
        mut shared: Option<&mut AcmeRedis>,
    ) -> Result<(String, String), String> {
        let ids = [Identifier::Dns(host.to_string())];
        let mut order = account
            .new_order(&NewOrder::new(&ids))
            .await
            .map_err(|e| format!("new order: {e}"))?;
        let mut authorizations = order.authorizations();
        while let Some(authz) = authorizations.next().await {
            let mut authz = authz.map_err(|e| format!("authorization: {e}"))?;
            match authz.status {
                AuthorizationStatus::Pending => {}
                AuthorizationStatus::Valid => continue,
                other => return Err(format!("authorization is {other:?}")),
            }
            let mut challenge = authz
                .challenge(ChallengeType::Http01)
                .ok_or("the ACME server offers no HTTP-01 challenge")?;
            let key_auth = challenge.key_authorization().as_str().to_string();
            self.edge
                .publish_challenge(&challenge.token, key_auth.clone());
            tokens.push(challenge.token.clone());
            if let Some(redis) = shared.as_deref_mut() {
                // The CA may ask any node: wait until they have all read it.
                if !redis.publish_challenge(&challenge.token, &key_auth).await {
                    return Err("the challenge could not be shared through Redis".to_string());
                }
                tokio::time::sleep(SHARED_CHALLENGE_WAIT).await;
            }
            challenge
                .set_ready()
                .await
                .map_err(|e| format!("challenge: {e}"))?;
        }
        let retry = RetryPolicy::new()
            .initial_delay(Duration::from_millis(250))
            .timeout(Duration::from_secs(60));
        let status = order
            .poll_ready(&retry)
            .await
            .map_err(|e| format!("validation: {e}"))?;
        if status != OrderStatus::Ready {
            return Err(format!("order is {status:?} after validation"));
        }
        let key = order
            .finalize()
            .await
            .map_err(|e| format!("finalize: {e}"))?;
        let chain = order
            .poll_certificate(&retry)
            .await
            .map_err(|e| format!("certificate: {e}"))?;
        Ok((chain, key))
    }
}

/// Cluster mode: keeps the edge's copy of every node's challenges fresh.
async fn read_shared_challenges(mut redis: AcmeRedis, edge: Arc<Edge>, mut stop: ShutdownWatch) {
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

/// The account in `storage/account.json`, or a new one saved there.
async fn load_account(config: &crate::config::AcmeConfig) -> Result<Account, String> {
    let path = config.storage.join("account.json");
    let builder = || match &config.ca_file {
        Some(ca) => Account::builder_with_root(ca).map_err(|e| format!("ca_file: {e}")),
        None => Account::builder().map_err(|e| e.to_string()),
    };
    if let Ok(saved) = std::fs::read(&path) {
        let credentials: AccountCredentials =
            serde_json::from_slice(&saved).map_err(|e| format!("{}: {e}", path.display()))?;
        return builder()?
            .from_credentials(credentials)
            .await
            .map_err(|e| e.to_string());
    }
    let contact = config.email.as_ref().map(|e| format!("mailto:{e}"));
    let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
    let (account, credentials) = builder()?
        .create(
            &NewAccount {
                contact: &contacts,
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            config.directory.clone(),
            None,
        )
        .await
        .map_err(|e| e.to_string())?;
    let json = serde_json::to_vec_pretty(&credentials).map_err(|e| e.to_string())?;
    super::private_dir(&config.storage)
        .map_err(|e| format!("{}: {e}", config.storage.display()))?;
    write_private(&path, &json)?;
    log::info!("ACME: account created at {}", config.directory);
    Ok(account)
}

/// Writes `HOST.key` then `HOST.crt` (the store reads a pair by its
/// `.crt`), each through a temporary file and a rename.
fn save(storage: &Path, host: &str, chain: &str, key: &str) -> Result<(), String> {
    let dir = storage.join("certs");
    super::private_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // Check before installing: a chain that does not load is not served.
    super::store::certified_key(chain.as_bytes(), key.as_bytes(), host, Source::Acme)?;
    write_private(&dir.join(format!("{host}.key")), key.as_bytes())?;
    write_private(&dir.join(format!("{host}.crt")), chain.as_bytes())
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| format!("{}: {e}", path.display()))
}

/// How long a shared backoff ending at `retry_at` (unix seconds, read
/// from Redis) still holds at `now`: `None` once over. No node writes a
/// wait longer than [`MAX_BACKOFF`], so a longer one (a corrupt or hostile
/// value) is cut to it rather than trusted, or overflowing an `Instant`.
fn backoff_left(retry_at: u64, now: u64) -> Option<Duration> {
    (retry_at > now).then(|| Duration::from_secs(retry_at - now).min(MAX_BACKOFF))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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
