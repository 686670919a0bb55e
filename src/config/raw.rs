//! The file format exactly as written: serde structs that reject unknown
//! keys. Nothing here is validated beyond types; `validate/` turns these
//! into the `Config` the rest of the program uses.

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    /// Required; absent is reported by validation, naming the field.
    pub listen: Option<Vec<RawListen>>,
    pub public_protocol: Option<String>,
    #[serde(default)]
    pub trust_forwarded_for: bool,
    pub tenant_header: Option<String>,
    pub admin: Option<RawAdmin>,
    pub shards: Option<Vec<RawShard>>,
    #[serde(default)]
    pub routing: RawRouting,
    #[serde(default)]
    pub limits: RawLimits,
    pub regions: Option<Vec<RawRegion>>,
    pub domains: Option<RawDomains>,
    #[serde(default)]
    pub retry: Switch<RawRetry>,
    #[serde(default)]
    pub upstream: RawUpstream,
    #[serde(default)]
    pub health: RawHealth,
    #[serde(default)]
    pub state: Switch<RawState>,
    #[serde(default)]
    pub log: RawLog,
    #[serde(default)]
    pub request_id: RawRequestId,
    pub tracing: Option<RawTracing>,
    pub cluster: Option<RawCluster>,
    pub tls: Option<RawTlsSection>,
    /// Response compression (DESIGN §10); absent: off.
    pub compression: Option<RawCompression>,
    /// HTTP/3's settings (DESIGN §9), for the `quic` listeners.
    #[serde(default)]
    pub quic: RawQuic,
    /// Tenant plans (DESIGN §6), in configuration order.
    #[serde(default)]
    pub plans: indexmap::IndexMap<String, RawPlan>,
    /// Tenant → plan name.
    #[serde(default)]
    pub tenants: std::collections::HashMap<String, String>,
    pub default_plan: Option<String>,
}

/// One of `plans:`. Each field: absent = `limits`' value, `null` = no
/// limit.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPlan {
    #[serde(default, deserialize_with = "nullable")]
    pub rate: Option<Option<RawRate>>,
    #[serde(default, deserialize_with = "nullable")]
    pub connection_cap: Option<Option<i64>>,
    #[serde(default, deserialize_with = "nullable")]
    pub max_body_bytes: Option<Option<u64>>,
    pub routes: Option<BTreeMap<String, RawRate>>,
    #[serde(default, deserialize_with = "nullable")]
    pub per_client: Option<Option<RawPerClient>>,
}

/// `tls:` (DESIGN §5).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTlsSection {
    pub certs: Option<String>,
    pub default_cert: Option<String>,
    pub unknown_sni: Option<String>,
    pub alpn: Option<Vec<String>>,
    pub handshake_timeout_ms: Option<u64>,
    pub h2_max_concurrent_streams: Option<u32>,
    pub acme: Option<RawAcme>,
}

/// `tls.acme:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAcme {
    pub directory: Option<String>,
    pub email: Option<String>,
    pub storage: Option<String>,
    pub ca_file: Option<String>,
    pub orders_per_hour: Option<u32>,
}

/// `cluster:` (DESIGN §4).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCluster {
    /// One URL (a single Redis) or a list (Redis Cluster seed nodes).
    pub redis: Option<OneOrMany>,
    pub node_id: Option<String>,
    pub key_prefix: Option<String>,
    pub sync_interval_ms: Option<u64>,
    pub on_redis_down: Option<String>,
    pub secret_file: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// Pingora's server settings that make sense in one file with ours.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub threads: Option<usize>,
    pub pid_file: Option<String>,
    pub upgrade_sock: Option<String>,
    pub daemon: Option<bool>,
    pub error_log: Option<String>,
    pub user: Option<String>,
    pub group: Option<String>,
    pub working_directory: Option<String>,
    pub grace_period_seconds: Option<u64>,
    pub graceful_shutdown_timeout_seconds: Option<u64>,
    pub work_stealing: Option<bool>,
    pub fast_path: Option<bool>,
    pub listener_tasks_per_fd: Option<usize>,
    pub upstream_keepalive_pool_size: Option<usize>,
    pub ca_file: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListen {
    pub addr: String,
    pub tls: Option<RawListenTls>,
    #[serde(default)]
    pub redirect_https: bool,
    #[serde(default)]
    pub proxy_protocol: bool,
    pub proxy_protocol_from: Option<Vec<String>>,
    /// HTTP/3 over QUIC (UDP) on this address (DESIGN §9).
    #[serde(default)]
    pub quic: bool,
}

/// `listen[].tls`: `true` (the `tls` section) or the old `{cert, key}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawListenTls {
    Section(bool),
    Files(RawTls),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    pub cert: String,
    pub key: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    pub addr: String,
    pub token_file: Option<String>,
    pub token_env: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawShard {
    pub id: String,
    pub url: String,
    pub weight: Option<f64>,
    pub region: Option<String>,
    pub tenants: Option<Vec<String>>,
    /// `http1` (default), `h2`, `auto` (DESIGN §8).
    pub protocol: Option<String>,
    /// `v2`: connections open with a PROXY header (DESIGN §10).
    pub proxy_protocol: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouting {
    pub hash: Option<String>,
    pub balance: Option<String>,
    pub channel_header: Option<String>,
    pub load: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRate {
    pub tokens: f64,
    pub refill_per_second: f64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    pub connection_cap: Option<i64>,
    pub rate: Option<RawRate>,
    #[serde(default)]
    pub routes: BTreeMap<String, RawRate>,
    #[serde(default)]
    pub deny: Vec<String>,
    pub header_timeout_ms: Option<u64>,
    pub max_header_bytes: Option<usize>,
    pub max_headers: Option<usize>,
    /// Absent: the default; `null`: unlimited.
    #[serde(default, deserialize_with = "nullable")]
    pub max_body_bytes: Option<Option<u64>>,
    pub body_timeout_ms: Option<u64>,
    pub send_timeout_ms: Option<u64>,
    pub keepalive_timeout_ms: Option<u64>,
    pub max_tracked_tenants: Option<u64>,
    pub per_client: Option<RawPerClient>,
    pub max_tracked_clients: Option<u64>,
}

/// `compression` (DESIGN §10).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCompression {
    pub algorithms: Option<Vec<String>>,
    pub min_bytes: Option<u64>,
    pub types: Option<Vec<String>>,
    #[serde(default)]
    pub levels: RawLevels,
    pub max_streams: Option<u64>,
}

/// `quic` (DESIGN §9).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawQuic {
    pub max_streams: Option<u64>,
    pub early_data: Option<bool>,
    pub alt_svc_max_age: Option<u64>,
    pub max_connections: Option<u64>,
}

/// `compression.levels`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLevels {
    pub gzip: Option<u32>,
    pub br: Option<u32>,
    pub zstd: Option<i32>,
}

/// `per_client`: each client address's own bucket within its tenant.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPerClient {
    pub rate: RawRate,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRegion {
    pub id: String,
    pub weight: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDomains {
    #[serde(default)]
    pub map: indexmap::IndexMap<String, String>,
    pub fallback_suffix: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetry {
    pub attempts: Option<u32>,
    pub methods: Option<Vec<String>>,
    pub budget_percent: Option<f64>,
    pub budget_min_per_second: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub connect_timeout_ms: Option<u64>,
    pub headers_timeout_ms: Option<u64>,
    pub read_timeout_ms: Option<u64>,
    #[serde(default)]
    pub liveness: Switch<RawLiveness>,
    pub keepalive_timeout_ms: Option<u64>,
    pub pool_per_shard: Option<usize>,
    pub tls_verify: Option<bool>,
    pub dns_refresh_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLiveness {
    pub after_ms: Option<u64>,
    pub probe_timeout_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealth {
    pub interval_ms: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub fall: Option<u32>,
    pub rise: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawState {
    pub path: Option<String>,
    pub interval_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    /// Access log: `off` or a `log` level (`error` … `trace`).
    pub access: Option<String>,
    /// `text` or `json`.
    pub access_format: Option<String>,
    /// A file for the access log (else the process log).
    pub access_path: Option<String>,
}

/// `request_id:` (DESIGN §7).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRequestId {
    pub header: Option<String>,
    #[serde(default)]
    pub trust_incoming: bool,
}

/// `tracing:` (DESIGN §7).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTracing {
    pub otlp_endpoint: Option<String>,
    pub sample_ratio: Option<f64>,
    pub service_name: Option<String>,
}

/// A value that may be spelt `null` (as opposed to left out).
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// A section that can be turned off with `false` (or spelt out, or left at
/// its defaults with `true` or by omission).
#[derive(Debug)]
pub enum Switch<T> {
    Off,
    On(T),
}

impl<T: Default> Default for Switch<T> {
    fn default() -> Self {
        Switch::On(T::default())
    }
}

impl<'de, T: Deserialize<'de> + Default> Deserialize<'de> for Switch<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct SwitchVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de> + Default> Visitor<'de> for SwitchVisitor<T> {
            type Value = Switch<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`false`, `true` or a mapping")
            }

            fn visit_bool<E: de::Error>(self, on: bool) -> Result<Self::Value, E> {
                Ok(if on {
                    Switch::On(T::default())
                } else {
                    Switch::Off
                })
            }

            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Switch::On(T::default()))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Switch::On)
            }
        }

        d.deserialize_any(SwitchVisitor(PhantomData))
    }
}
