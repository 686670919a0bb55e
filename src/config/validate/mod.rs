//! Raw structs → validated [`Config`], with defaults. Every check names the
//! field it refuses; positions come from `locate.rs`.

use super::locate::{self, Position};
use super::raw::{RawConfig, RawRate};
use super::{Config, ConfigError, ConfigErrors, ListenerTls, TlsConfig};
use crate::limits::RateRule;
use http::HeaderName;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

mod admin;
mod cluster;
mod compression;
mod limits;
mod observability;
mod plans;
mod quic;
mod routing;
mod server;
mod tls;
mod upstream;

pub use routing::{parse_shard_url, shard_protocol, shard_proxy_protocol};

/// The longest duration a `*_ms` setting may have: a week.
const MAX_MS: u64 = 7 * 24 * 3600 * 1000;

/// Collects errors with the field positions of one document.
struct Checker<'a> {
    file: Option<&'a str>,
    positions: HashMap<String, Position>,
    errors: Vec<ConfigError>,
}

impl Checker<'_> {
    fn error(&mut self, field: impl Into<String>, message: impl Into<String>) {
        let field = field.into();
        self.errors.push(ConfigError {
            file: self.file.map(str::to_string),
            position: locate::find(&self.positions, &field),
            field,
            message: message.into(),
        });
    }

    /// A required top-level section that is absent: reported at the start
    /// of the document, where it would go.
    fn required<T: Default>(&mut self, field: &str, value: Option<T>) -> T {
        value.unwrap_or_else(|| {
            self.errors.push(ConfigError {
                file: self.file.map(str::to_string),
                position: Some((1, 1)),
                field: field.to_string(),
                message: "is required and missing".to_string(),
            });
            T::default()
        })
    }

    fn positive_ms(&mut self, field: &str, value: Option<u64>, default: u64) -> Duration {
        let ms = value.unwrap_or(default);
        if ms == 0 {
            self.error(field, "must be greater than 0");
        }
        // A deadline this far out would overflow `Instant` arithmetic.
        if ms > MAX_MS {
            self.error(field, format!("must be at most {MAX_MS} (a week)"));
        }
        Duration::from_millis(ms)
    }

    fn at_least_one(&mut self, field: &str, value: Option<u32>, default: u32) -> u32 {
        let n = value.unwrap_or(default);
        if n == 0 {
            self.error(field, "must be at least 1");
        }
        n
    }

    fn rate(&mut self, field: &str, raw: &RawRate) -> RateRule {
        if raw.tokens.is_nan() || raw.tokens < 0.0 {
            self.error(format!("{field}.tokens"), "must be a number ≥ 0");
        }
        if !raw.refill_per_second.is_finite() || raw.refill_per_second < 0.0 {
            self.error(
                format!("{field}.refill_per_second"),
                "must be a finite number ≥ 0",
            );
        }
        RateRule::new(raw.tokens, raw.refill_per_second)
    }

    fn weight(&mut self, field: &str, weight: Option<f64>) -> f64 {
        let w = weight.unwrap_or(1.0);
        if !w.is_finite() || w < 0.0 {
            self.error(field, "must be a finite number ≥ 0");
        }
        w
    }

    fn header_name(&mut self, field: &str, name: &str) -> Option<HeaderName> {
        match HeaderName::from_bytes(name.as_bytes()) {
            Ok(h) => Some(h),
            Err(_) => {
                self.error(field, format!("`{name}` is not a valid header name"));
                None
            }
        }
    }
}

/// Turns a serde_yaml error into ours: `shards[1]: message at line 4
/// column 5` → field, message, position.
fn parse_error(e: &serde_yaml::Error, file: Option<&str>) -> ConfigError {
    let mut message = e.to_string();
    let position = e.location().map(|l| (l.line(), l.column()));
    if let Some(at) = message.rfind(" at line ") {
        message.truncate(at);
    }
    let mut field = String::new();
    if let Some((head, rest)) = message.split_once(": ") {
        let looks_like_path = !head.is_empty()
            && head
                .chars()
                .all(|c| c.is_alphanumeric() || "._-[]/*".contains(c));
        if looks_like_path {
            field = head.to_string();
            message = rest.to_string();
        }
    }
    ConfigError {
        file: file.map(str::to_string),
        position,
        field,
        message,
    }
}

pub fn parse(text: &str, file: Option<&str>) -> Result<Config, ConfigErrors> {
    let raw: RawConfig = match serde_yaml::from_str(text) {
        Ok(raw) => raw,
        Err(e) => return Err(ConfigErrors(vec![parse_error(&e, file)])),
    };
    let mut c = Checker {
        file,
        positions: locate::positions(text),
        errors: Vec::new(),
    };
    let config = check(&mut c, raw);
    if c.errors.is_empty() {
        Ok(config)
    } else {
        Err(ConfigErrors(c.errors))
    }
}

fn check(c: &mut Checker<'_>, raw: RawConfig) -> Config {
    let server = server::check_server(c, raw.server);
    let (listen, quic_addrs) = match raw.listen {
        Some(listen) => server::check_listen(c, listen),
        None => (c.required("listen", None), Vec::new()),
    };
    let public_protocol = server::check_public_protocol(c, raw.public_protocol.as_deref());
    let tenant_header = routing::check_tenant_header(c, raw.tenant_header.as_deref());
    let admin = admin::check_admin(c, raw.admin);
    let regions = routing::check_regions(c, raw.regions);
    let shards = c.required("shards", raw.shards);
    let shards = routing::check_shards(c, shards, regions.as_deref(), server.fast_path);
    let routing = routing::check_routing(c, raw.routing);
    let limits = limits::check_limits(c, raw.limits);
    let plans = plans::check_plans(c, raw.plans, raw.tenants, raw.default_plan, &limits);
    let domains = c.required("domains", raw.domains);
    let domains = routing::check_domains(c, domains);
    let retry = upstream::check_retry(c, raw.retry);
    let upstream = upstream::check_upstream(c, raw.upstream);
    let health = upstream::check_health(c, raw.health);
    let state = cluster::check_state(c, raw.state);
    let log = observability::check_log(c, raw.log);
    let request_id = observability::check_request_id(c, raw.request_id, &tenant_header);
    let tracing = raw.tracing.map(|t| observability::check_tracing(c, t));
    let cluster_secret_given = raw.cluster.as_ref().map(|r| r.secret_file.is_some());
    let cluster = raw.cluster.map(|r| cluster::check_cluster(c, r));
    let wanted = listen.iter().any(|l| l.tls == ListenerTls::Section) || !quic_addrs.is_empty();
    let tls = tls::check_tls(c, raw.tls, wanted);
    let quic = quic::check_quic(c, raw.quic, quic_addrs, &listen);
    check_acme_secret(c, tls.as_ref(), cluster_secret_given);
    let compression = raw
        .compression
        .map(|r| compression::check_compression(c, r));
    Config {
        compression,
        quic,
        server,
        listen,
        public_protocol,
        trust_forwarded_for: raw.trust_forwarded_for,
        tenant_header,
        admin,
        shards,
        routing,
        limits,
        regions,
        domains,
        retry,
        upstream,
        health,
        state,
        log,
        request_id,
        tracing,
        cluster,
        tls,
        plans,
    }
}

/// `tls.acme` in cluster mode needs `cluster.secret_file`: the nodes seal
/// the ACME keys they share with it. `cluster_secret_given`: `None` when
/// there is no `cluster` section.
fn check_acme_secret(
    c: &mut Checker<'_>,
    tls: Option<&TlsConfig>,
    cluster_secret_given: Option<bool>,
) {
    let acme = tls.is_some_and(|t| t.acme.is_some());
    if acme && cluster_secret_given == Some(false) {
        c.error(
            "cluster.secret_file",
            "required with `tls.acme` in cluster mode: the nodes share ACME private keys \
             through Redis, sealed with this secret (a file of at least 32 bytes, the same \
             on every node)",
        );
    }
}

/// Logs a warning when a secret's file can be read by its group or by
/// others (sshd refuses such keys; we only say so, as the file may be
/// shared on purpose through a group).
fn warn_if_others_can_read(field: &str, path: &str) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return;
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        log::warn!(
            "{field}: `{path}` can be read by group or others (mode {mode:o}): `chmod 600 {path}`"
        );
    }
}

/// `addr` as an IP address and port (`listen[i].addr`, `admin.addr`).
fn socket_addr(c: &mut Checker<'_>, field: &str, addr: &str) -> Option<SocketAddr> {
    match addr.parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(_) => {
            c.error(
                field,
                format!(
                    "`{addr}`: expected an IP address and port, e.g. 0.0.0.0:8080 or [::]:8080"
                ),
            );
            None
        }
    }
}
