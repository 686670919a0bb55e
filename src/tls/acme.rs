//! Certificates for tenant domains through ACME (RFC 8555), HTTP-01.
//!
//! Every second the service looks at the exact hosts of the domain map
//! (config and admin API alike): a host no certificate file covers, with
//! no ACME certificate or one past two thirds of its lifetime, is due. One
//! order runs at a time, at most `orders_per_hour` start in any hour, and
//! a host whose order failed waits (1 min, doubling to 6 h) before the
//! next. The challenge is answered by the plain listeners before routing
//! (`HeadGuard`), the key and chain are written under
//! `acme.storage/certs/HOST.{crt,key}` and the store reloads at once, so
//! the certificate is served as soon as it is issued. Nothing is ordered
//! for a host the domain map does not hold, nor for wildcards or IPs.
//!
//! The client is instant-acme (see `Cargo.toml` for why).

use super::store::Source;
use super::Edge;
use crate::control::Control;
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

/// The background service ordering and renewing certificates.
pub struct AcmeService {
    control: Arc<Control>,
    edge: Arc<Edge>,
}

impl AcmeService {
    pub fn new(control: Arc<Control>, edge: Arc<Edge>) -> Self {
        AcmeService { control, edge }
    }
}

#[async_trait]
impl BackgroundService for AcmeService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(config) = self.edge.config.acme.clone() else {
            return;
        };
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut account = None;
        let mut account_retry = Instant::now();
        let mut account_backoff = Duration::from_secs(5);
        let mut started: VecDeque<Instant> = VecDeque::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            let Some(host) = self.due_host(Instant::now()) else {
                continue;
            };
            if account.is_none() {
                if Instant::now() < account_retry {
                    continue;
                }
                match load_account(&config).await {
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
            started.push_back(now);
            self.order_one(acct, &host, &config.storage).await;
        }
    }
}

impl AcmeService {
    /// The first host that needs a certificate now, if any; hosts ACME no
    /// longer serves leave the board.
    fn due_host(&self, now: Instant) -> Option<String> {
        let store = self.edge.store.as_ref()?;
        let wanted: Vec<String> = self
            .control
            .domains
            .list()
            .into_iter()
            .map(|e| e.host)
            .filter(|h| orderable(h))
            .collect();
        self.edge
            .acme
            .hosts
            .lock()
            .retain(|h, _| wanted.iter().any(|w| w == h));
        let unix_now = unix_now();
        wanted.into_iter().find(|host| {
            let fresh = match store.covering(host) {
                Some(c) if c.source == Source::File => true,
                Some(c) => {
                    let life = (c.expires - c.not_before).max(0);
                    (unix_now as i64) < c.not_before + life * 2 / 3
                }
                None => false,
            };
            !fresh && !self.edge.acme.waiting(host, now)
        })
    }

    /// Orders, validates and installs a certificate for `host`.
    async fn order_one(&self, account: &Account, host: &str, storage: &Path) {
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
            Duration::from_secs(120),
            self.issue(account, host, &mut tokens),
        )
        .await
        .unwrap_or_else(|_| Err("the order did not finish within 120 s".to_string()));
        for token in &tokens {
            self.edge.withdraw_challenge(token);
        }
        let result = result.and_then(|(chain, key)| save(storage, host, &chain, &key));
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
                board.issued.fetch_add(1, Ordering::Relaxed);
                log::info!("ACME: certificate for {host} issued and served");
                board.set(
                    host,
                    HostStatus {
                        state: "issued",
                        failures: 0,
                        last_error: None,
                        retry_at: None,
                        retry_instant: None,
                    },
                );
            }
            Err(e) => {
                board.failed.fetch_add(1, Ordering::Relaxed);
                let wait = FIRST_BACKOFF
                    .saturating_mul(1 << failures.min(16))
                    .min(MAX_BACKOFF);
                log::warn!("ACME: order for {host} failed ({e}); next try in {wait:?}");
                board.set(
                    host,
                    HostStatus {
                        state: "failed",
                        failures: failures + 1,
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
            self.edge.publish_challenge(&challenge.token, key_auth);
            tokens.push(challenge.token.clone());
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

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
