//! Raw structs → validated [`Config`], with defaults. Every check names the
//! field it refuses; positions come from `locate.rs`.

use super::locate::{self, Position};
use super::raw::*;
use super::*;
use crate::routing::{DomainMap, Fallback};
use std::collections::{BTreeSet, HashMap};
use std::net::ToSocketAddrs;

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
    let server = check_server(c, raw.server);
    let listen = match raw.listen {
        Some(listen) => check_listen(c, listen),
        None => c.required("listen", None),
    };
    let public_protocol = raw.public_protocol.as_deref().and_then(|p| match p {
        "http" => Some(Scheme::Http),
        "https" => Some(Scheme::Https),
        other => {
            c.error(
                "public_protocol",
                format!("`{other}`: expected http or https"),
            );
            None
        }
    });
    let tenant_header = raw
        .tenant_header
        .as_deref()
        .map_or(Some(HeaderName::from_static("x-tenant-id")), |h| {
            c.header_name("tenant_header", h)
        })
        .unwrap_or(HeaderName::from_static("x-tenant-id"));
    if ["traceparent", "tracestate"]
        .iter()
        .any(|t| crate::wire::fields::same_field(tenant_header.as_str(), t))
    {
        c.error(
            "tenant_header",
            format!("`{tenant_header}` is W3C trace context's: name another field"),
        );
    }
    let admin = check_admin(c, raw.admin);
    let regions = check_regions(c, raw.regions);
    let shards = c.required("shards", raw.shards);
    let shards = check_shards(c, shards, regions.as_deref());
    let routing = check_routing(c, raw.routing);
    let limits = check_limits(c, raw.limits);
    let plans = check_plans(c, raw.plans, raw.tenants, raw.default_plan, &limits);
    let domains = c.required("domains", raw.domains);
    let domains = check_domains(c, domains);
    let retry = check_retry(c, raw.retry);
    let upstream = check_upstream(c, raw.upstream);
    let health = check_health(c, raw.health);
    let state = match raw.state {
        Switch::Off => None,
        Switch::On(s) => Some(StateConfig {
            path: PathBuf::from(
                s.path
                    .unwrap_or_else(|| "/var/lib/shardgate/state.json".to_string()),
            ),
            interval: c.positive_ms("state.interval_ms", s.interval_ms, 1000),
        }),
    };
    let (file_given, format_given) = (
        raw.log.access_path.is_some(),
        raw.log.access_format.is_some(),
    );
    let log = LogConfig {
        access_format: match raw.log.access_format.as_deref() {
            None | Some("text") => AccessFormat::Text,
            Some("json") => AccessFormat::Json,
            Some(other) => {
                c.error(
                    "log.access_format",
                    format!("`{other}`: expected text or json"),
                );
                AccessFormat::Text
            }
        },
        access_path: match raw.log.access_path {
            Some(path) if path.is_empty() => {
                c.error("log.access_path", "must not be empty");
                None
            }
            path => path.map(PathBuf::from),
        },
        access: match raw.log.access.as_deref() {
            // Asking for a file or a format turns the log on.
            None if file_given || format_given => Some(log::Level::Info),
            Some("off") if file_given => {
                c.error(
                    "log.access_path",
                    "the access log is off (`log.access: off`): remove one of the two",
                );
                None
            }
            None | Some("off") => None,
            Some(level) => match level.parse::<log::Level>() {
                Ok(l) => Some(l),
                Err(_) => {
                    c.error(
                        "log.access",
                        format!("`{level}`: expected off, error, warn, info, debug or trace"),
                    );
                    None
                }
            },
        },
    };
    let request_id = check_request_id(c, raw.request_id, &tenant_header);
    let tracing = raw.tracing.map(|t| check_tracing(c, t));
    let cluster_secret_given = raw.cluster.as_ref().map(|r| r.secret_file.is_some());
    let cluster = raw.cluster.map(|r| check_cluster(c, r));
    let wanted = listen.iter().any(|l| l.tls == ListenerTls::Section);
    let tls = check_tls(c, raw.tls, wanted);
    let acme = tls.as_ref().is_some_and(|t| t.acme.is_some());
    if acme && cluster_secret_given == Some(false) {
        c.error(
            "cluster.secret_file",
            "required with `tls.acme` in cluster mode: the nodes share ACME private keys through Redis, sealed with this secret (a file of at least 32 bytes, the same on every node)",
        );
    }
    Config {
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

/// `tracing`: a plain-HTTP collector (`http://host[:port][/prefix]`), a
/// ratio between 0 and 1, a service name.
fn check_tracing(c: &mut Checker<'_>, t: RawTracing) -> TracingConfig {
    let traces_url = match t.otlp_endpoint.as_deref() {
        None => {
            c.error(
                "tracing.otlp_endpoint",
                "required: the collector's OTLP/HTTP address, e.g. http://127.0.0.1:4318",
            );
            String::new()
        }
        Some(url) => match crate::trace::export::Endpoint::parse(url) {
            // What the exporter will parse it as, checked now.
            Ok(_) => {
                let traces = format!("{}/v1/traces", url.trim_end_matches('/'));
                match traces.parse::<http::Uri>() {
                    Ok(uri) if uri.host().is_some() => traces,
                    _ => {
                        c.error(
                            "tracing.otlp_endpoint",
                            format!("`{url}`: not a URL (an IPv6 address goes in brackets: http://[::1]:4318)"),
                        );
                        String::new()
                    }
                }
            }
            Err(why) => {
                c.error("tracing.otlp_endpoint", format!("`{url}`: {why}"));
                String::new()
            }
        },
    };
    let sample_ratio = t.sample_ratio.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&sample_ratio) {
        c.error(
            "tracing.sample_ratio",
            format!("{sample_ratio}: expected a number from 0 to 1"),
        );
    }
    let service_name = t.service_name.unwrap_or_else(|| "shardgate".to_string());
    if service_name.is_empty() || service_name.chars().any(char::is_control) {
        c.error(
            "tracing.service_name",
            "expected a name of visible characters",
        );
    }
    TracingConfig {
        traces_url,
        sample_ratio,
        service_name,
    }
}

/// `request_id`: a field that means nothing else to HTTP or to shardgate.
fn check_request_id(
    c: &mut Checker<'_>,
    r: RawRequestId,
    tenant_header: &HeaderName,
) -> RequestIdConfig {
    let default = HeaderName::from_static("x-request-id");
    // The default too: `tenant_header: x-request-id` needs another one.
    let name = r.header.as_deref().unwrap_or("x-request-id");
    let header = match c.header_name("request_id.header", name) {
        Some(header) if has_a_meaning(&header, tenant_header) => {
            c.error(
                "request_id.header",
                format!("`{name}` already has a meaning (framing, forwarding, hop-by-hop, tracing, shardgate's own answers or the tenant header): name another field"),
            );
            default
        }
        Some(header) => header,
        None => default,
    };
    RequestIdConfig {
        header,
        trust_incoming: r.trust_incoming,
    }
}

/// Whether a field is one HTTP or shardgate already gives a meaning: the
/// request ID in it would be dropped, or would change what a message
/// means (its framing, its content, a handshake, a cache's or a browser's
/// reading of it).
fn has_a_meaning(name: &HeaderName, tenant_header: &HeaderName) -> bool {
    use crate::wire::fields::{is_hop_by_hop, same_field, Owned};
    const TAKEN: [&str; 40] = [
        "baggage",
        "b3",
        "uber-trace-id",
        "x-cloud-trace-context",
        "x-amzn-trace-id",
        "sentry-trace",
        "x-http-method-override",
        "x-http-method",
        "x-method-override",
        "x-original-url",
        "x-rewrite-url",
        "max-forwards",
        "early-data",
        "host",
        "expect",
        "date",
        "location",
        "retry-after",
        "cookie",
        "set-cookie",
        "authorization",
        "www-authenticate",
        "cache-control",
        "pragma",
        "expires",
        "age",
        "etag",
        "last-modified",
        "vary",
        "range",
        "origin",
        "referer",
        "user-agent",
        "server",
        "via",
        "link",
        "allow",
        "strict-transport-security",
        "traceparent",
        "tracestate",
    ];
    const TAKEN_PREFIXES: [&str; 10] = [
        "grpc-",
        "x-b3-",
        "x-forwarded-",
        "http2-",
        "content-",
        "accept",
        "if-",
        "sec-",
        "access-control-",
        "proxy-",
    ];
    let name = name.as_str();
    let owned = Owned {
        tenant_header: tenant_header.as_str(),
        request_id_header: "",
        trust_forwarded_for: false,
        traceparent: false,
        tracestate: false,
    };
    let lower = name.replace('_', "-");
    is_hop_by_hop(name)
        || owned.owns(name)
        || TAKEN.iter().any(|t| same_field(name, t))
        || TAKEN_PREFIXES.iter().any(|p| lower.starts_with(p))
        || lower == "transfer-encoding"
}

/// The most plans a configuration may name: each is a value of the
/// `plan` metric label.
pub const MAX_PLANS: usize = 256;

/// `plans`, `tenants`, `default_plan` (DESIGN §6): each plan field falls
/// back to `limits`; a plan a tenant or `default_plan` names must exist.
fn check_plans(
    c: &mut Checker<'_>,
    raw: indexmap::IndexMap<String, RawPlan>,
    tenants: HashMap<String, String>,
    default_plan: Option<String>,
    limits: &LimitsConfig,
) -> PlansConfig {
    if raw.len() > MAX_PLANS {
        c.error("plans", format!("at most {MAX_PLANS} plans"));
    }
    let mut plans = Vec::with_capacity(raw.len());
    for (name, plan) in raw.into_iter().take(MAX_PLANS) {
        let field = format!("plans.{name}");
        let label = |b: u8| b.is_ascii_alphanumeric() || b"_.-".contains(&b);
        if name.is_empty() || name.len() > 64 || !name.bytes().all(label) {
            c.error(
                &field,
                "a plan's name is 1 to 64 letters, digits, `_`, `.` or `-`",
            );
        }
        // `none` labels tenants on no plan in the metrics; `-` says "no
        // plan" in the cluster's shared state.
        if name == "none" || name == "-" {
            c.error(&field, format!("`{name}` is reserved (it means no plan)"));
        }
        let rate = match plan.rate {
            None => limits.rate,
            Some(None) => RateRule::UNLIMITED,
            Some(Some(rate)) => c.rate(&format!("{field}.rate"), &rate),
        };
        let connection_cap = match plan.connection_cap {
            None => limits.connection_cap,
            Some(None) => None,
            Some(Some(cap)) => match u64::try_from(cap) {
                Ok(cap) => Some(cap),
                Err(_) => {
                    c.error(format!("{field}.connection_cap"), "must be an integer ≥ 0");
                    None
                }
            },
        };
        let routes = match plan.routes {
            None => limits.routes.clone(),
            Some(routes) => (routes.iter())
                .map(|(prefix, rule)| {
                    let at = format!("{field}.routes.{prefix}");
                    if !prefix.starts_with('/') {
                        c.error(&at, format!("route prefix `{prefix}` must start with `/`"));
                    }
                    (prefix.clone(), c.rate(&at, rule))
                })
                .collect(),
        };
        plans.push(PlanConfig {
            name,
            rate,
            connection_cap,
            max_body_bytes: plan.max_body_bytes.unwrap_or(limits.max_body_bytes),
            routes,
        });
    }
    let mut config = PlansConfig {
        plans,
        tenants: HashMap::with_capacity(tenants.len()),
        default_plan: None,
    };
    let mut tenants: Vec<_> = tenants.into_iter().collect();
    // Errors in a stable order.
    tenants.sort_unstable();
    for (tenant, plan) in tenants {
        match config.index_of(&plan) {
            Some(index) => {
                config.tenants.insert(tenant.into(), index);
            }
            None => c.error(
                format!("tenants.{tenant}"),
                format!("unknown plan `{plan}` (not in `plans`)"),
            ),
        }
    }
    if let Some(plan) = default_plan {
        config.default_plan = config.index_of(&plan);
        if config.default_plan.is_none() {
            c.error(
                "default_plan",
                format!("unknown plan `{plan}` (not in `plans`)"),
            );
        }
    }
    config
}

fn check_cluster(c: &mut Checker<'_>, r: RawCluster) -> ClusterConfig {
    let check_url = |c: &mut Checker<'_>, field: &str, url: &str| {
        if redis::Client::open(url).is_err() || !url.starts_with("redis") {
            c.error(
                field,
                format!("`{url}`: expected a redis:// or rediss:// URL"),
            );
        }
    };
    let redis = match r.redis {
        None => {
            c.error(
                "cluster.redis",
                "required: a Redis URL or a list of Redis Cluster seed URLs",
            );
            RedisTarget::Single(String::new())
        }
        Some(OneOrMany::One(url)) => {
            check_url(c, "cluster.redis", &url);
            RedisTarget::Single(url)
        }
        Some(OneOrMany::Many(urls)) => {
            if urls.is_empty() {
                c.error("cluster.redis", "the list of seed nodes is empty");
            }
            for (i, url) in urls.iter().enumerate() {
                check_url(c, &format!("cluster.redis[{i}]"), url);
            }
            RedisTarget::Cluster(urls)
        }
    };
    let node_id = r.node_id.unwrap_or_else(host_name);
    if node_id.is_empty() || node_id.len() > 128 || node_id.contains(char::is_whitespace) {
        c.error("cluster.node_id", "must be 1–128 characters without spaces");
    }
    let on_redis_down = match r.on_redis_down.as_deref() {
        None | Some("local-share") => OnRedisDown::LocalShare,
        Some("allow") => OnRedisDown::Allow,
        Some("deny") => OnRedisDown::Deny,
        Some(other) => {
            c.error(
                "cluster.on_redis_down",
                format!("`{other}`: expected local-share, allow or deny"),
            );
            OnRedisDown::LocalShare
        }
    };
    let secret = r.secret_file.and_then(|path| match std::fs::read(&path) {
        Ok(bytes) if bytes.trim_ascii().len() >= 32 => {
            warn_if_others_can_read("cluster.secret_file", &path);
            Some(super::Secret(bytes.trim_ascii().into()))
        }
        Ok(_) => {
            c.error(
                "cluster.secret_file",
                format!(
                    "`{path}`: holds fewer than 32 bytes (e.g. `openssl rand -base64 48 > {path}`)"
                ),
            );
            None
        }
        Err(e) => {
            c.error("cluster.secret_file", format!("`{path}`: {e}"));
            None
        }
    });
    ClusterConfig {
        redis,
        node_id,
        key_prefix: r.key_prefix.unwrap_or_else(|| "shardgate:".to_string()),
        sync_interval: c.positive_ms("cluster.sync_interval_ms", r.sync_interval_ms, 50),
        on_redis_down,
        secret,
    }
}

/// The machine's host name (`cluster.node_id`'s default).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "shardgate".to_string())
}

fn check_server(c: &mut Checker<'_>, s: RawServer) -> ServerSettings {
    let threads = s.threads.unwrap_or(2);
    if threads == 0 {
        c.error("server.threads", "must be at least 1");
    }
    let listener_tasks_per_fd = s.listener_tasks_per_fd.unwrap_or(1);
    if listener_tasks_per_fd == 0 {
        c.error("server.listener_tasks_per_fd", "must be at least 1");
    }
    ServerSettings {
        threads,
        pid_file: s
            .pid_file
            .unwrap_or_else(|| "/tmp/shardgate.pid".to_string()),
        upgrade_sock: s
            .upgrade_sock
            .unwrap_or_else(|| "/tmp/shardgate_upgrade.sock".to_string()),
        daemon: s.daemon.unwrap_or(false),
        error_log: s.error_log,
        user: s.user,
        group: s.group,
        working_directory: s.working_directory.map(PathBuf::from),
        grace_period_seconds: s.grace_period_seconds.unwrap_or(5),
        graceful_shutdown_timeout_seconds: s.graceful_shutdown_timeout_seconds.unwrap_or(5),
        work_stealing: s.work_stealing.unwrap_or(true),
        fast_path: s.fast_path.unwrap_or(true),
        listener_tasks_per_fd,
        upstream_keepalive_pool_size: s.upstream_keepalive_pool_size.unwrap_or(1024),
        ca_file: s.ca_file,
    }
}

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

fn check_listen(c: &mut Checker<'_>, listen: Vec<RawListen>) -> Vec<Listener> {
    if listen.is_empty() {
        c.error("listen", "at least one listener is needed");
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (i, l) in listen.into_iter().enumerate() {
        let field = format!("listen[{i}].addr");
        let Some(addr) = socket_addr(c, &field, &l.addr) else {
            continue;
        };
        if !seen.insert(addr) {
            c.error(field, format!("`{addr}` is listed twice"));
        }
        let tls = match l.tls {
            None | Some(RawListenTls::Section(false)) => ListenerTls::Off,
            Some(RawListenTls::Section(true)) => ListenerTls::Section,
            Some(RawListenTls::Files(t)) => {
                for (name, path) in [("cert", &t.cert), ("key", &t.key)] {
                    if !Path::new(path).is_file() {
                        c.error(
                            format!("listen[{i}].tls.{name}"),
                            format!("`{path}`: no such file"),
                        );
                    }
                }
                ListenerTls::Files(PathBuf::from(t.cert), PathBuf::from(t.key))
            }
        };
        if l.redirect_https && tls.is_on() {
            c.error(
                format!("listen[{i}].redirect_https"),
                "a TLS listener cannot redirect to https: it is https",
            );
        }
        out.push(Listener {
            addr,
            tls,
            redirect_https: l.redirect_https,
        });
    }
    out
}

/// `tls:` (DESIGN §5). `wanted`: a listener says `tls: true`.
fn check_tls(c: &mut Checker<'_>, raw: Option<RawTlsSection>, wanted: bool) -> Option<TlsConfig> {
    let Some(r) = raw else {
        if wanted {
            c.error(
                "tls",
                "a listener says `tls: true`: the `tls` section (certs and/or acme) is needed",
            );
        }
        return None;
    };
    let defaults = TlsConfig::default();
    let certs = r.certs.map(PathBuf::from);
    if let Some(dir) = &certs {
        if !dir.is_dir() {
            c.error(
                "tls.certs",
                format!("`{}`: no such directory", dir.display()),
            );
        }
    }
    if certs.is_none() && r.acme.is_none() {
        c.error(
            "tls.certs",
            "required unless `tls.acme` is set: a directory of NAME.crt + NAME.key pairs",
        );
    }
    let refuse = match r.unknown_sni.as_deref() {
        None | Some("default") => false,
        Some("refuse") => true,
        Some(other) => {
            c.error(
                "tls.unknown_sni",
                format!("`{other}`: expected default or refuse"),
            );
            false
        }
    };
    let default_cert = match (r.default_cert, refuse) {
        (Some(_), true) => {
            c.error(
                "tls.default_cert",
                "not with `unknown_sni: refuse`: unknown names are refused",
            );
            None
        }
        (Some(name), false) => {
            let valid = !name.is_empty() && !name.contains(['/', '\\']) && name != "..";
            match &certs {
                _ if !valid => c.error(
                    "tls.default_cert",
                    format!("`{name}`: expected a NAME of NAME.crt in tls.certs"),
                ),
                Some(dir) if dir.is_dir() && !dir.join(format!("{name}.crt")).is_file() => c.error(
                    "tls.default_cert",
                    format!("`{name}`: no {name}.crt in `{}`", dir.display()),
                ),
                None => c.error(
                    "tls.default_cert",
                    "names a file of `tls.certs`, which is not set",
                ),
                _ => {}
            }
            Some(name)
        }
        (None, _) => None,
    };
    let alpn = match r.alpn {
        None => defaults.alpn,
        Some(list) => {
            if list.is_empty() {
                c.error("tls.alpn", "at least one protocol is needed: h2, http/1.1");
            }
            let mut out = Vec::new();
            for (i, p) in list.iter().enumerate() {
                match p.as_str() {
                    "h2" | "http/1.1" => out.push(p.as_bytes().to_vec()),
                    other => c.error(
                        format!("tls.alpn[{i}]"),
                        format!("`{other}`: expected h2 or http/1.1"),
                    ),
                }
            }
            out
        }
    };
    let h2_max_concurrent_streams = r
        .h2_max_concurrent_streams
        .unwrap_or(defaults.h2_max_concurrent_streams);
    if h2_max_concurrent_streams == 0 {
        c.error("tls.h2_max_concurrent_streams", "must be greater than 0");
    }
    let acme = r.acme.map(|a| {
        let directory = a.directory.unwrap_or_default();
        if !directory.starts_with("https://") || http::Uri::try_from(directory.as_str()).is_err() {
            c.error(
                "tls.acme.directory",
                format!("`{directory}`: expected the ACME server's https:// directory URL"),
            );
        }
        let storage = match a.storage {
            Some(s) => PathBuf::from(s),
            None => {
                c.error(
                    "tls.acme.storage",
                    "required: the directory for the account and the issued certificates",
                );
                PathBuf::new()
            }
        };
        if storage.exists() && !storage.is_dir() {
            c.error(
                "tls.acme.storage",
                format!("`{}`: not a directory", storage.display()),
            );
        }
        if let Some(email) = &a.email {
            if !email.contains('@') || email.contains(char::is_whitespace) {
                c.error(
                    "tls.acme.email",
                    format!("`{email}`: expected an email address"),
                );
            }
        }
        let ca_file = a.ca_file.map(PathBuf::from);
        if let Some(f) = &ca_file {
            if !f.is_file() {
                c.error(
                    "tls.acme.ca_file",
                    format!("`{}`: no such file", f.display()),
                );
            }
        }
        let orders_per_hour = a.orders_per_hour.unwrap_or(60);
        if orders_per_hour == 0 {
            c.error("tls.acme.orders_per_hour", "must be greater than 0");
        }
        AcmeConfig {
            directory,
            email: a.email,
            storage,
            ca_file,
            orders_per_hour,
        }
    });
    Some(TlsConfig {
        certs,
        default_cert,
        alpn,
        handshake_timeout: c.positive_ms(
            "tls.handshake_timeout_ms",
            r.handshake_timeout_ms,
            10_000,
        ),
        h2_max_concurrent_streams,
        acme,
    })
}

fn check_admin(c: &mut Checker<'_>, admin: Option<RawAdmin>) -> AdminConfig {
    let raw = admin.unwrap_or(RawAdmin {
        addr: "127.0.0.1:9901".to_string(),
        token_file: None,
        token_env: None,
    });
    let addr = socket_addr(c, "admin.addr", &raw.addr)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 9901)));
    let token = match (&raw.token_file, &raw.token_env) {
        (Some(_), Some(_)) => {
            c.error("admin.token_env", "give token_file or token_env, not both");
            None
        }
        (Some(path), None) => match std::fs::read_to_string(path) {
            Ok(t) => {
                warn_if_others_can_read("admin.token_file", path);
                token_of(c, "admin.token_file", t.trim_end_matches(['\n', '\r']))
            }
            Err(e) => {
                c.error("admin.token_file", format!("`{path}`: cannot read it: {e}"));
                None
            }
        },
        (None, Some(var)) => match std::env::var(var) {
            Ok(t) => token_of(c, "admin.token_env", &t),
            Err(_) => {
                c.error(
                    "admin.token_env",
                    format!("environment variable `{var}` is not set"),
                );
                None
            }
        },
        (None, None) => None,
    };
    let has_token = raw.token_file.is_some() || raw.token_env.is_some();
    if !has_token && !addr.ip().is_loopback() {
        c.error(
            "admin.addr",
            format!("`{addr}` is not a loopback address: set admin.token_file or admin.token_env"),
        );
    }
    AdminConfig { addr, token }
}

/// The admin token read from `field`, if long enough to resist guessing.
fn token_of(c: &mut Checker<'_>, field: &str, token: &str) -> Option<AdminToken> {
    if token.len() < AdminToken::MIN_BYTES {
        c.error(
            field,
            format!(
                "the admin token has {} bytes, fewer than {} (e.g. `openssl rand -base64 24`)",
                token.len(),
                AdminToken::MIN_BYTES
            ),
        );
        return None;
    }
    Some(AdminToken::new(token.as_bytes()))
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

fn check_regions(c: &mut Checker<'_>, regions: Option<Vec<RawRegion>>) -> Option<Vec<Region>> {
    let regions = regions?;
    if regions.is_empty() {
        c.error(
            "regions",
            "list at least one region, or leave the section out",
        );
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (i, r) in regions.into_iter().enumerate() {
        if r.id.is_empty() {
            c.error(format!("regions[{i}].id"), "must not be empty");
        } else if !seen.insert(r.id.clone()) {
            c.error(
                format!("regions[{i}].id"),
                format!("duplicate region id `{}`", r.id),
            );
        }
        let weight = c.weight(&format!("regions[{i}].weight"), r.weight);
        out.push(Region { id: r.id, weight });
    }
    Some(out)
}

/// A shard URL: `http`/`https` (`ws`/`wss` accepted as aliases), a host and
/// a port, no path. Returns `(tls, host, port)`.
pub fn parse_shard_url(url: &str) -> Result<(bool, String, u16), String> {
    let uri: http::Uri = url.parse().map_err(|_| format!("`{url}` is not a URL"))?;
    let tls = match uri.scheme_str() {
        Some("http") | Some("ws") => false,
        Some("https") | Some("wss") => true,
        Some(other) => {
            return Err(format!(
                "`{url}`: scheme `{other}` is not http, https, ws or wss"
            ))
        }
        None => return Err(format!("`{url}`: the scheme is missing (http://host:port)")),
    };
    let host = uri
        .host()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| format!("`{url}`: the host is missing"))?;
    let port = uri
        .port_u16()
        .ok_or_else(|| format!("`{url}`: the port is missing (http://host:port)"))?;
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!(
            "`{url}`: a shard URL has no path or query (requests keep their own)"
        ));
    }
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok((tls, host, port))
}

fn check_shards(
    c: &mut Checker<'_>,
    shards: Vec<RawShard>,
    regions: Option<&[Region]>,
) -> Vec<Shard> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (i, s) in shards.into_iter().enumerate() {
        if s.id.is_empty() {
            c.error(format!("shards[{i}].id"), "must not be empty");
        } else if !seen.insert(s.id.clone()) {
            c.error(
                format!("shards[{i}].id"),
                format!("duplicate shard id `{}`", s.id),
            );
        }
        match parse_shard_url(&s.url) {
            Ok((_, host, port)) => {
                if host.parse::<std::net::IpAddr>().is_err()
                    && (host.as_str(), port).to_socket_addrs().is_err()
                {
                    c.error(
                        format!("shards[{i}].url"),
                        format!("cannot resolve host `{host}`"),
                    );
                }
            }
            Err(msg) => c.error(format!("shards[{i}].url"), msg),
        }
        let weight = c.weight(&format!("shards[{i}].weight"), s.weight);
        if let (Some(region), Some(regions)) = (&s.region, regions) {
            if !regions.iter().any(|r| &r.id == region) {
                c.error(
                    format!("shards[{i}].region"),
                    format!("unknown region `{region}` (not in `regions`)"),
                );
            }
        }
        out.push(Shard {
            id: crate::routing::ShardId::new(&s.id),
            url: s.url,
            weight,
            region: s.region,
            tenants: s.tenants,
        });
    }
    out
}

fn check_routing(c: &mut Checker<'_>, r: RawRouting) -> RoutingConfig {
    let hash = match r.hash.as_deref().unwrap_or("jump") {
        "jump" => HashKind::Jump,
        "rendezvous" => HashKind::Rendezvous,
        "hrw" => HashKind::Hrw,
        other => {
            c.error(
                "routing.hash",
                format!("unknown hash `{other}` (expected jump, rendezvous or hrw)"),
            );
            HashKind::Jump
        }
    };
    let balance = match r.balance.as_deref().unwrap_or("sticky").parse::<Balance>() {
        Ok(b) => b,
        Err(msg) => {
            c.error("routing.balance", msg);
            Balance::Sticky
        }
    };
    let load = match r.load.as_deref().unwrap_or("none") {
        "none" => LoadKind::None,
        "active-connections" => LoadKind::ActiveConnections,
        other => {
            c.error(
                "routing.load",
                format!("unknown load `{other}` (expected none or active-connections)"),
            );
            LoadKind::None
        }
    };
    let channel_header = r
        .channel_header
        .as_deref()
        .and_then(|h| c.header_name("routing.channel_header", h));
    RoutingConfig {
        hash,
        balance,
        channel_header,
        load,
    }
}

/// 100 MiB, Cloudflare's free-plan limit.
const DEFAULT_MAX_BODY_BYTES: u64 = 100 * 1024 * 1024;

fn check_limits(c: &mut Checker<'_>, l: RawLimits) -> LimitsConfig {
    let connection_cap = l.connection_cap.and_then(|cap| match u64::try_from(cap) {
        Ok(cap) => Some(cap),
        Err(_) => {
            c.error("limits.connection_cap", "must be an integer ≥ 0");
            None
        }
    });
    let rate = l
        .rate
        .as_ref()
        .map_or(RateRule::UNLIMITED, |r| c.rate("limits.rate", r));
    let mut routes = Vec::new();
    for (prefix, rule) in &l.routes {
        let field = format!("limits.routes.{prefix}");
        if !prefix.starts_with('/') {
            c.error(
                &field,
                format!("route prefix `{prefix}` must start with `/`"),
            );
        }
        let rule = c.rate(&field, rule);
        routes.push((prefix.clone(), rule));
    }
    let max_header_bytes = l.max_header_bytes.unwrap_or(32 * 1024);
    // Above Pingora's own ceilings (1 MiB, 256 fields), a head that passes
    // ours would get Pingora's 400 instead of a 431.
    if !(1024..=1024 * 1024).contains(&max_header_bytes) {
        c.error(
            "limits.max_header_bytes",
            "must be between 1024 and 1048576",
        );
    }
    let max_headers = l.max_headers.unwrap_or(100);
    if !(1..=256).contains(&max_headers) {
        c.error("limits.max_headers", "must be between 1 and 256");
    }
    let max_tracked_tenants = match l.max_tracked_tenants {
        None => crate::limits::DEFAULT_MAX_TRACKED,
        Some(n @ 64..=100_000_000) => n as usize,
        Some(_) => {
            c.error(
                "limits.max_tracked_tenants",
                "must be between 64 and 100000000",
            );
            crate::limits::DEFAULT_MAX_TRACKED
        }
    };
    LimitsConfig {
        max_tracked_tenants,
        connection_cap,
        rate,
        routes,
        deny: l.deny,
        header_timeout: c.positive_ms("limits.header_timeout_ms", l.header_timeout_ms, 10_000),
        max_header_bytes,
        max_headers,
        max_body_bytes: l.max_body_bytes.unwrap_or(Some(DEFAULT_MAX_BODY_BYTES)),
        body_timeout: c.positive_ms("limits.body_timeout_ms", l.body_timeout_ms, 60_000),
        send_timeout: c.positive_ms("limits.send_timeout_ms", l.send_timeout_ms, 60_000),
        keepalive_timeout: c.positive_ms(
            "limits.keepalive_timeout_ms",
            l.keepalive_timeout_ms,
            60_000,
        ),
    }
}

fn check_domains(c: &mut Checker<'_>, d: RawDomains) -> DomainsConfig {
    let probe = DomainMap::new(Fallback::None);
    let mut map = Vec::new();
    for (host, tenant) in d.map {
        let field = format!("domains.map.{host}");
        if tenant.is_empty() {
            c.error(&field, "the tenant must not be empty");
        }
        if crate::routing::domain::normalize(&host).is_empty() {
            c.error(&field, "the host is empty");
        }
        if let Err(e) = probe.add(&host, &tenant) {
            c.error(&field, e.to_string());
        }
        map.push((host, tenant));
    }
    if let Some(suffix) = &d.fallback_suffix {
        let trimmed = suffix.trim_start_matches('.');
        if trimmed.is_empty() || suffix.contains('*') || suffix.contains(':') {
            c.error(
                "domains.fallback_suffix",
                format!("`{suffix}`: expected a domain suffix such as .apps.example.com"),
            );
        }
    }
    DomainsConfig {
        map,
        fallback_suffix: d.fallback_suffix,
    }
}

fn check_retry(c: &mut Checker<'_>, r: Switch<RawRetry>) -> RetryConfig {
    let Switch::On(r) = r else {
        return RetryConfig::off();
    };
    let attempts = c.at_least_one("retry.attempts", r.attempts, 2);
    let methods = r
        .methods
        .unwrap_or_else(|| vec!["GET".into(), "HEAD".into(), "OPTIONS".into()])
        .into_iter()
        .enumerate()
        .filter_map(|(i, m)| {
            let valid = !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase());
            match (valid, Method::from_bytes(m.as_bytes())) {
                (true, Ok(method)) => Some(method),
                _ => {
                    c.error(
                        format!("retry.methods[{i}]"),
                        format!("`{m}` is not an HTTP method in upper case"),
                    );
                    None
                }
            }
        })
        .collect();
    let budget_percent = r.budget_percent.unwrap_or(20.0);
    if !(0.0..=100.0).contains(&budget_percent) {
        c.error("retry.budget_percent", "must be between 0 and 100");
    }
    RetryConfig {
        attempts,
        methods,
        budget_percent,
        budget_min_per_second: r.budget_min_per_second.unwrap_or(10),
    }
}

fn check_upstream(c: &mut Checker<'_>, u: RawUpstream) -> UpstreamConfig {
    let liveness = match u.liveness {
        Switch::Off => None,
        Switch::On(l) => Some(LivenessConfig {
            after: c.positive_ms("upstream.liveness.after_ms", l.after_ms, 1000),
            probe_timeout: c.positive_ms(
                "upstream.liveness.probe_timeout_ms",
                l.probe_timeout_ms,
                500,
            ),
        }),
    };
    UpstreamConfig {
        connect_timeout: c.positive_ms("upstream.connect_timeout_ms", u.connect_timeout_ms, 2000),
        headers_timeout: c.positive_ms("upstream.headers_timeout_ms", u.headers_timeout_ms, 30_000),
        read_timeout: c.positive_ms("upstream.read_timeout_ms", u.read_timeout_ms, 60_000),
        liveness,
        keepalive_timeout: c.positive_ms(
            "upstream.keepalive_timeout_ms",
            u.keepalive_timeout_ms,
            60_000,
        ),
        pool_per_shard: u.pool_per_shard.unwrap_or(256),
        tls_verify: u.tls_verify.unwrap_or(true),
        dns_refresh: c.positive_ms("upstream.dns_refresh_ms", u.dns_refresh_ms, 30_000),
    }
}

fn check_health(c: &mut Checker<'_>, h: RawHealth) -> HealthConfig {
    HealthConfig {
        interval: c.positive_ms("health.interval_ms", h.interval_ms, 2000),
        timeout: c.positive_ms("health.timeout_ms", h.timeout_ms, 1000),
        fall: c.at_least_one("health.fall", h.fall, 3),
        rise: c.at_least_one("health.rise", h.rise, 2),
    }
}
