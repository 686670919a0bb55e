//! Configuration: one YAML file, parsed into raw structs (`raw.rs`), then
//! validated into [`Config`] (`validate/`, one file per section). Nothing
//! past this module sees an `Option` that validation should have settled,
//! and every error names the field (and, where the YAML parser knows it,
//! the line and column).

mod cidr;
mod locate;
mod raw;
mod validate;

use crate::limits::RateRule;
use crate::routing::{Balance, Region, Shard};
use http::{HeaderName, Method};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use crate::access_log::{AccessFormat, LogConfig};
pub use crate::trace::TracingConfig;
pub use cidr::Cidr;
pub use validate::{parse_shard_url, shard_protocol, shard_proxy_protocol};

/// The validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub server: ServerSettings,
    pub listen: Vec<Listener>,
    /// `X-Forwarded-Proto` advertised upstream; `None` = the listener's scheme.
    pub public_protocol: Option<Scheme>,
    pub trust_forwarded_for: bool,
    /// Set on upstream requests; a client-sent value is always removed.
    pub tenant_header: HeaderName,
    pub admin: AdminConfig,
    pub shards: Vec<Shard>,
    pub routing: RoutingConfig,
    pub limits: LimitsConfig,
    pub regions: Option<Vec<Region>>,
    pub domains: DomainsConfig,
    pub retry: RetryConfig,
    pub upstream: UpstreamConfig,
    pub health: HealthConfig,
    pub state: Option<StateConfig>,
    pub log: LogConfig,
    /// Each request's ID (DESIGN §7).
    pub request_id: RequestIdConfig,
    /// OpenTelemetry tracing (DESIGN §7); `None`: off, and a client's
    /// `traceparent` passes to the shard unchanged.
    pub tracing: Option<TracingConfig>,
    /// Cluster mode; `None`: a single node, no Redis.
    pub cluster: Option<ClusterConfig>,
    /// TLS at the edge; `None`: no `tls` section.
    pub tls: Option<TlsConfig>,
    /// Tenant plans (DESIGN §6).
    pub plans: PlansConfig,
    /// Response compression (DESIGN §10); `None`: off.
    pub compression: Option<crate::wire::compress::Policy>,
    /// HTTP/3 (DESIGN §9): its listeners and settings; `None` without a
    /// `quic` listener.
    pub quic: Option<QuicConfig>,
}

/// A tenant plan (DESIGN §6) with `limits`' values where it left a field
/// out.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanConfig {
    pub name: String,
    pub rate: RateRule,
    pub connection_cap: Option<u64>,
    pub max_body_bytes: Option<u64>,
    /// Route prefix → bucket, in configuration order.
    pub routes: Vec<(String, RateRule)>,
    /// Each client address's bucket (unlimited: none).
    pub per_client: RateRule,
}

/// `plans`, `tenants` and `default_plan`, validated: every plan a tenant
/// names exists.
#[derive(Clone, Debug, Default)]
pub struct PlansConfig {
    /// In configuration order; a plan's index is its number below.
    pub plans: Vec<PlanConfig>,
    /// Tenant → index in `plans`.
    pub tenants: std::collections::HashMap<compact_str::CompactString, u16>,
    /// The plan of a tenant `tenants` does not name; `None`: `limits`.
    pub default_plan: Option<u16>,
}

impl Config {
    /// The body limit of a plan (`None`: `limits`'); `None` = unlimited.
    pub fn max_body_of(&self, plan: Option<u16>) -> Option<u64> {
        let plan = plan.and_then(|i| self.plans.plans.get(usize::from(i)));
        plan.map_or(self.limits.max_body_bytes, |p| p.max_body_bytes)
    }

    /// The largest body any tenant may send (`None`: some may send any):
    /// what the head reader refuses before the tenant is known.
    pub fn largest_max_body(&self) -> Option<u64> {
        let plans = self.plans.plans.iter().map(|p| p.max_body_bytes);
        std::iter::once(self.limits.max_body_bytes)
            .chain(plans)
            .try_fold(0, |largest, max| Some(largest.max(max?)))
    }

    /// Every route prefix with a bucket, in `limits` or in a plan, each
    /// once, in the order first seen: the route list every plan's limits
    /// share.
    pub fn route_prefixes(&self) -> Vec<String> {
        let mut all: Vec<String> = Vec::new();
        let plans = self.plans.plans.iter().flat_map(|p| p.routes.iter());
        for (prefix, _) in self.limits.routes.iter().chain(plans) {
            if !all.contains(prefix) {
                all.push(prefix.clone());
            }
        }
        all
    }
}

impl PlansConfig {
    /// The plan named `name`, by index.
    pub fn index_of(&self, name: &str) -> Option<u16> {
        (self.plans.iter().position(|p| p.name == name)).map(|i| i as u16)
    }

    /// The plan `tenant` follows by configuration (`None`: `limits`).
    pub fn plan_of(&self, tenant: &str) -> Option<&PlanConfig> {
        let index = self.tenants.get(tenant).copied().or(self.default_plan)?;
        self.plans.get(usize::from(index))
    }
}

/// `cluster:` validated (DESIGN §4).
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Where Redis is.
    pub redis: RedisTarget,
    pub node_id: String,
    pub key_prefix: String,
    /// How often a node settles with Redis.
    pub sync_interval: Duration,
    pub on_redis_down: OnRedisDown,
    /// `cluster.secret_file`'s contents: what ACME private keys are sealed
    /// with in Redis.
    pub secret: Option<Secret>,
}

/// Secret bytes, never printed.
#[derive(Clone)]
pub struct Secret(pub std::sync::Arc<[u8]>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Printed (Debug) without the URLs' passwords.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One Redis server.
    Single(String),
    /// Seed nodes of a Redis Cluster.
    Cluster(Vec<String>),
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisTarget::Single(url) => f.debug_tuple("Single").field(&redact(url)).finish(),
            RedisTarget::Cluster(urls) => {
                let urls: Vec<String> = urls.iter().map(|u| redact(u)).collect();
                f.debug_tuple("Cluster").field(&urls).finish()
            }
        }
    }
}

/// A Redis URL without its password (or user): `redis://***@host`.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

/// What limits do while Redis cannot be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnRedisDown {
    /// Each bucket and cap divided by the nodes last seen alive.
    LocalShare,
    /// Limits are not enforced.
    Allow,
    /// Every limited request is refused.
    Deny,
}

impl OnRedisDown {
    pub fn as_str(&self) -> &'static str {
        match self {
            OnRedisDown::LocalShare => "local-share",
            OnRedisDown::Allow => "allow",
            OnRedisDown::Deny => "deny",
        }
    }
}

/// Pingora's server settings (shardgate's defaults where they differ).
#[derive(Clone, Debug)]
pub struct ServerSettings {
    pub threads: usize,
    pub pid_file: String,
    pub upgrade_sock: String,
    pub daemon: bool,
    pub error_log: Option<String>,
    pub user: Option<String>,
    pub group: Option<String>,
    pub working_directory: Option<PathBuf>,
    pub grace_period_seconds: u64,
    pub graceful_shutdown_timeout_seconds: u64,
    pub work_stealing: bool,
    /// shardgate's own forwarding for every request (`proxy::fast`); off:
    /// everything takes Pingora's proxy path.
    pub fast_path: bool,
    pub listener_tasks_per_fd: usize,
    pub upstream_keepalive_pool_size: usize,
    pub ca_file: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub fn as_str(&self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Listener {
    pub addr: SocketAddr,
    pub tls: ListenerTls,
    /// A plain listener answering 308 to `https` (ACME challenges aside).
    pub redirect_https: bool,
    /// `proxy_protocol`: each connection opens with a PROXY header, taken
    /// only from peers in these blocks (`proxy_protocol_from`).
    pub proxy_protocol: Option<Vec<Cidr>>,
}

/// HTTP/3 over QUIC (DESIGN §9), with the `tls` section's certificates.
#[derive(Clone, Debug)]
pub struct QuicConfig {
    /// The UDP addresses (`listen[] {quic: true}`).
    pub listeners: Vec<SocketAddr>,
    /// Requests in flight at once on one connection.
    pub max_streams: u32,
    /// Connections open at once, per listener (new ones are refused).
    pub max_connections: usize,
    /// 0-RTT: a request sent in early data is served if idempotent (else
    /// 425).
    pub early_data: bool,
    /// The `Alt-Svc` field TLS listeners answer with (`None`: not
    /// advertised).
    pub alt_svc: Option<http::HeaderValue>,
}

/// What a listener does with TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenerTls {
    /// Plain HTTP.
    Off,
    /// The `tls` section: SNI over its certificates.
    Section,
    /// The old form: one certificate and key (PEM paths).
    Files(PathBuf, PathBuf),
}

impl ListenerTls {
    pub fn is_on(&self) -> bool {
        *self != ListenerTls::Off
    }
}

/// `tls:` validated (DESIGN §5).
#[derive(Clone, Debug)]
pub struct TlsConfig {
    /// The directory of `NAME.crt` + `NAME.key` pairs.
    pub certs: Option<PathBuf>,
    /// The `NAME` served for no or unknown SNI; `None`: refuse those.
    pub default_cert: Option<String>,
    /// ALPN protocols offered, in order of preference (`h2`, `http/1.1`).
    pub alpn: Vec<Vec<u8>>,
    /// A client that has not finished its handshake by then is dropped.
    pub handshake_timeout: Duration,
    /// Concurrent HTTP/2 streams per client connection.
    pub h2_max_concurrent_streams: u32,
    pub acme: Option<AcmeConfig>,
}

impl Default for TlsConfig {
    /// What a listener in the old `{cert, key}` form gets without a `tls`
    /// section.
    fn default() -> Self {
        TlsConfig {
            certs: None,
            default_cert: None,
            alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            handshake_timeout: Duration::from_secs(10),
            h2_max_concurrent_streams: 128,
            acme: None,
        }
    }
}

/// `tls.acme:` validated.
#[derive(Clone, Debug)]
pub struct AcmeConfig {
    /// The ACME server's directory URL.
    pub directory: String,
    pub email: Option<String>,
    /// Where the account and the issued certificates are kept.
    pub storage: PathBuf,
    /// Extra trust for the ACME server (a test CA such as Pebble's).
    pub ca_file: Option<PathBuf>,
    /// New orders per hour, at most (one at a time).
    pub orders_per_hour: u32,
}

#[derive(Clone, Debug)]
pub struct AdminConfig {
    pub addr: SocketAddr,
    /// `None`: only allowed on a loopback address, where `/v1/` is open.
    pub token: Option<AdminToken>,
}

/// The admin bearer token, kept only as its SHA-256 digest: never printed,
/// and compared digest to digest, so the time a comparison takes says
/// nothing of the token's length or bytes.
#[derive(Clone)]
pub struct AdminToken([u8; 32]);

impl AdminToken {
    /// The fewest bytes a token may have (validation refuses shorter).
    pub const MIN_BYTES: usize = 16;

    pub fn new(token: &[u8]) -> Self {
        AdminToken(sha256(token))
    }

    /// Whether `given` is the token, in constant time.
    pub fn matches(&self, given: &[u8]) -> bool {
        let given = sha256(given);
        let diff = (given.iter().zip(&self.0)).fold(0u8, |d, (a, b)| d | (a ^ b));
        diff == 0
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref());
    out
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashKind {
    Jump,
    Rendezvous,
    Hrw,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadKind {
    None,
    ActiveConnections,
}

#[derive(Clone, Debug)]
pub struct RoutingConfig {
    pub hash: HashKind,
    pub balance: Balance,
    pub channel_header: Option<HeaderName>,
    pub load: LoadKind,
}

#[derive(Clone, Debug)]
pub struct LimitsConfig {
    pub connection_cap: Option<u64>,
    pub rate: RateRule,
    /// Route prefix → bucket, in configuration order.
    pub routes: Vec<(String, RateRule)>,
    pub deny: Vec<String>,
    /// The whole request head must arrive within this (slowloris) → 408.
    pub header_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// Largest request body forwarded (→ 413); `None` = unlimited.
    pub max_body_bytes: Option<u64>,
    /// Longest pause between two reads of a request body.
    pub body_timeout: Duration,
    /// Longest a write to a client may stall (it stopped reading).
    pub send_timeout: Duration,
    /// How long an idle client keep-alive connection stays open.
    pub keepalive_timeout: Duration,
    /// Tenants whose state is kept at most (the least recently seen idle
    /// ones go first past it).
    pub max_tracked_tenants: usize,
    /// Each client address's bucket within its tenant (unlimited: none).
    pub per_client: RateRule,
    /// Client buckets kept at most (the least recently seen go first).
    pub max_tracked_clients: usize,
}

#[derive(Clone, Debug)]
pub struct DomainsConfig {
    pub map: Vec<(String, String)>,
    pub fallback_suffix: Option<String>,
}

#[derive(Clone, Debug)]
pub struct RetryConfig {
    /// Total tries per request (1 = no retry).
    pub attempts: u32,
    pub methods: Vec<Method>,
    /// Retries in flight may be at most this share of requests in flight…
    pub budget_percent: f64,
    /// …or, whatever that share, this many per second.
    pub budget_min_per_second: u32,
}

impl RetryConfig {
    pub fn off() -> Self {
        RetryConfig {
            attempts: 1,
            methods: Vec::new(),
            budget_percent: 0.0,
            budget_min_per_second: 0,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct LivenessConfig {
    pub after: Duration,
    pub probe_timeout: Duration,
}

#[derive(Clone, Debug)]
pub struct UpstreamConfig {
    pub connect_timeout: Duration,
    pub headers_timeout: Duration,
    /// Longest silence of a shard between two reads once its response head
    /// came (nginx's `proxy_read_timeout`); also bounds a stalled write of
    /// the request body to it.
    pub read_timeout: Duration,
    pub liveness: Option<LivenessConfig>,
    /// How long an idle pooled upstream connection is kept.
    pub keepalive_timeout: Duration,
    /// Idle connections the fast transport keeps per shard and worker
    /// thread.
    pub pool_per_shard: usize,
    /// Whether the certificates of `https` shards are verified.
    pub tls_verify: bool,
    /// How often shards named by host name are resolved again.
    pub dns_refresh: Duration,
}

#[derive(Clone, Debug)]
pub struct HealthConfig {
    pub interval: Duration,
    pub timeout: Duration,
    pub fall: u32,
    pub rise: u32,
}

#[derive(Clone, Debug)]
pub struct StateConfig {
    pub path: PathBuf,
    pub interval: Duration,
}

/// `request_id` (DESIGN §7).
#[derive(Clone, Debug)]
pub struct RequestIdConfig {
    /// The field on every answer and upstream request.
    pub header: HeaderName,
    /// Keep a client's well-formed value instead of making one.
    pub trust_incoming: bool,
}

/// One problem with a configuration file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub file: Option<String>,
    /// `(line, column)`, 1-based, where known.
    pub position: Option<(usize, usize)>,
    /// The field, e.g. `shards[1].url` (empty for the document itself).
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{file}:")?;
            if let Some((line, col)) = self.position {
                write!(f, "{line}:{col}:")?;
            }
            f.write_str(" ")?;
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

/// Every problem found (at least one).
#[derive(Clone, Debug)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "error: {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigErrors> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![ConfigError {
                file: Some(file.clone()),
                position: None,
                field: String::new(),
                message: format!("cannot read the file: {e}"),
            }])
        })?;
        Config::parse(&text, Some(&file))
    }

    /// Parses and validates configuration text; `file` only labels errors.
    pub fn parse(text: &str, file: Option<&str>) -> Result<Config, ConfigErrors> {
        validate::parse(text, file)
    }
}
