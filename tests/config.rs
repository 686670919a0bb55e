//! The configuration file: the example loads with its values, defaults
//! apply, and every kind of mistake is refused with the field (and line)
//! named.

use shardgate::config::{AccessFormat, Config, HashKind, LoadKind, Scheme};
use shardgate::routing::Balance;
use std::time::Duration;

const MINIMAL: &str = "listen: [{ addr: 127.0.0.1:8080 }]\nshards: []\ndomains: {}\n";

#[test]
fn the_example_configuration_loads() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/shardgate.yaml");
    let c = Config::load(path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.shards.len(), 4);
    assert_eq!(c.shards[1].weight, 2.0);
    assert_eq!(
        c.shards[3].tenants.as_deref(),
        Some(&["acme".to_string()][..])
    );
    assert_eq!(c.public_protocol, Some(Scheme::Https));
    assert_eq!(c.routing.hash, HashKind::Jump);
    assert_eq!(c.limits.connection_cap, Some(100));
    assert_eq!(c.limits.routes[0].0, "/api/export");
    assert_eq!(c.regions.as_ref().map(Vec::len), Some(2));
    assert_eq!(c.domains.map.len(), 2);
    assert_eq!(c.retry.attempts, 2);
    assert_eq!(
        c.upstream.liveness.map(|l| l.after),
        Some(Duration::from_millis(1000))
    );
}

#[test]
fn defaults_fill_every_optional_section() {
    let c = Config::parse(MINIMAL, None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.grace_period_seconds, 5);
    assert_eq!(c.server.graceful_shutdown_timeout_seconds, 5);
    assert_eq!(c.tenant_header.as_str(), "x-tenant-id");
    assert_eq!(c.routing.balance, Balance::Sticky);
    assert_eq!(c.routing.load, LoadKind::None);
    assert_eq!(c.limits.connection_cap, None);
    assert!(c.limits.rate.is_unlimited());
    assert_eq!(c.limits.header_timeout, Duration::from_secs(10));
    assert_eq!(c.retry.attempts, 2);
    assert_eq!(c.retry.methods.len(), 3);
    assert_eq!(c.upstream.headers_timeout, Duration::from_secs(30));
    assert_eq!(c.health.fall, 3);
    assert_eq!(c.health.rise, 2);
    assert_eq!(c.admin.addr.to_string(), "127.0.0.1:9901");
    assert!(c.admin.token.is_none());
}

#[test]
fn a_shards_protocol_is_http1_unless_it_says_h2_or_auto() {
    use shardgate::routing::ShardProtocol;
    let text = "listen: [{ addr: 127.0.0.1:8080 }]\ndomains: {}\nshards:\n  - { id: a, url: \"http://127.0.0.1:1\" }\n  - { id: b, url: \"http://127.0.0.1:2\", protocol: h2 }\n  - { id: c, url: \"https://127.0.0.1:3\", protocol: auto }\n";
    let c = Config::parse(text, None).unwrap_or_else(|e| panic!("{e}"));
    let protocols: Vec<ShardProtocol> = c.shards.iter().map(|s| s.protocol).collect();
    assert_eq!(
        protocols,
        [ShardProtocol::Http1, ShardProtocol::H2, ShardProtocol::Auto]
    );
    // A snapshot of an HTTP/1.1 shard keeps the reference's shape.
    let json = serde_json::to_value(&c.shards[0]).expect("json");
    assert!(json.get("protocol").is_none(), "{json}");
    assert_eq!(
        serde_json::to_value(&c.shards[1]).expect("json")["protocol"],
        "h2"
    );
}

#[test]
fn switches_turn_sections_off() {
    let text = format!("{MINIMAL}retry: false\nupstream: {{ liveness: false }}\nstate: false\n");
    let c = Config::parse(&text, None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.retry.attempts, 1);
    assert!(c.upstream.liveness.is_none());
    assert!(c.state.is_none());
}

/// (what is wrong, YAML, the field the error must name, the line it must give)
const BROKEN: &[(&str, &str, &str, usize)] = &[
    ("unknown top-level key", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nlimitz: {}\n", "", 4),
    ("typo in a limit", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nlimits:\n  conection_cap: 3\n", "limits", 5),
    ("negative tokens", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nlimits:\n  rate: { tokens: -1, refill_per_second: 1 }\n", "limits.rate.tokens", 5),
    ("negative refill", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nlimits:\n  routes:\n    /x: { tokens: 1, refill_per_second: -2 }\n", "limits.routes./x.refill_per_second", 6),
    ("negative cap", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nlimits:\n  connection_cap: -5\n", "limits.connection_cap", 5),
    ("too few tracked tenants", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nlimits:\n  max_tracked_tenants: 10\n", "limits.max_tracked_tenants", 5),
    ("too many tracked tenants", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nlimits:\n  max_tracked_tenants: 200000000\n", "limits.max_tracked_tenants", 5),
    ("route without slash", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nlimits:\n  routes:\n    api: { tokens: 1, refill_per_second: 1 }\n", "limits.routes.api", 6),
    ("negative weight", "listen: [{ addr: 127.0.0.1:80 }]\nshards:\n  - { id: a, url: \"http://127.0.0.1:1\", weight: -1 }\ndomains: {}\n", "shards[0].weight", 3),
    ("weight not a number", "listen: [{ addr: 127.0.0.1:80 }]\nshards:\n  - { id: a, url: \"http://127.0.0.1:1\", weight: heavy }\ndomains: {}\n", "shards[0].weight", 3),
    ("unknown balance", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nrouting:\n  balance: random\n", "routing.balance", 5),
    ("unknown hash", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nrouting: { hash: md5 }\n", "routing.hash", 4),
    ("url without scheme", "listen: [{ addr: 127.0.0.1:80 }]\nshards:\n  - id: a\n    url: 127.0.0.1:3000\ndomains: {}\n", "shards[0].url", 4),
    ("url without port", "listen: [{ addr: 127.0.0.1:80 }]\nshards:\n  - id: a\n    url: http://127.0.0.1\ndomains: {}\n", "shards[0].url", 4),
    ("ftp url", "listen: [{ addr: 127.0.0.1:80 }]\nshards:\n  - id: a\n    url: ftp://127.0.0.1:21\ndomains: {}\n", "shards[0].url", 4),
    ("unknown shard protocol", "listen: [{ addr: 127.0.0.1:80 }]\nshards:\n  - { id: a, url: \"http://127.0.0.1:1\", protocol: h3 }\ndomains: {}\n", "shards[0].protocol", 3),
    ("auto over plain http", "listen: [{ addr: 127.0.0.1:80 }]\nshards:\n  - { id: a, url: \"http://127.0.0.1:1\", protocol: auto }\ndomains: {}\n", "shards[0].protocol", 3),
    ("duplicate shard id", "listen: [{ addr: 127.0.0.1:80 }]\nshards:\n  - { id: a, url: \"http://127.0.0.1:1\" }\n  - { id: a, url: \"http://127.0.0.1:2\" }\ndomains: {}\n", "shards[1].id", 4),
    ("duplicate region id", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nregions:\n  - { id: us }\n  - { id: us }\n", "regions[1].id", 6),
    ("shard in an unknown region", "listen: [{ addr: 127.0.0.1:80 }]\nshards:\n  - { id: a, url: \"http://127.0.0.1:1\", region: mars }\ndomains: {}\nregions: [{ id: us }]\n", "shards[0].region", 3),
    ("bad wildcard", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains:\n  map:\n    \"a.*.com\": t\n", "domains.map.a.*.com", 5),
    ("tokenless admin on all interfaces", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nadmin: { addr: 0.0.0.0:9901 }\n", "admin.addr", 4),
    ("unreadable token file", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nadmin: { addr: 0.0.0.0:9901, token_file: /nonexistent/token }\n", "admin.token_file", 4),
    ("listen address without port", "listen: [{ addr: 127.0.0.1 }]\nshards: []\ndomains: {}\n", "listen[0].addr", 1),
    ("missing listen", "shards: []\ndomains: {}\n", "listen", 1),
    ("missing shards", "listen: [{ addr: 127.0.0.1:80 }]\ndomains: {}\n", "shards", 1),
    ("missing domains", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\n", "domains", 1),
    ("lowercase retry method", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nretry: { methods: [get] }\n", "retry.methods[0]", 4),
    ("zero attempts", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nretry: { attempts: 0 }\n", "retry.attempts", 4),
    ("zero headers timeout", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nupstream:\n  headers_timeout_ms: 0\n", "upstream.headers_timeout_ms", 5),
    ("zero read timeout", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nupstream:\n  read_timeout_ms: 0\n", "upstream.read_timeout_ms", 5),
    ("liveness typo", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nupstream:\n  liveness: { after: 5 }\n", "upstream.liveness", 5),
    ("zero rise", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nhealth: { rise: 0 }\n", "health.rise", 4),
    ("bad tenant header", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\ntenant_header: \"x tenant\"\n", "tenant_header", 4),
    ("bad public protocol", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\npublic_protocol: gopher\n", "public_protocol", 4),
    ("unknown server setting", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nserver: { treads: 4 }\n", "server", 4),
    ("more fields than Pingora reads", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nlimits:\n  max_headers: 300\n", "limits.max_headers", 5),
    ("a head larger than Pingora reads", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nlimits:\n  max_header_bytes: 2000000\n", "limits.max_header_bytes", 5),
    ("not yaml", "listen: [\n", "", 2),
    ("a tenant on an unknown plan", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nplans: { free: {} }\ntenants:\n  acme: gold\n", "tenants.acme", 6),
    ("an unknown default plan", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nplans: { free: {} }\ndefault_plan: gold\n", "default_plan", 5),
    ("a plan's negative tokens", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nplans:\n  free: { rate: { tokens: -1, refill_per_second: 1 } }\n", "plans.free.rate.tokens", 5),
    ("a plan's negative cap", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nplans:\n  free: { connection_cap: -1 }\n", "plans.free.connection_cap", 5),
    ("a plan's route without slash", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nplans:\n  free:\n    routes: { api: { tokens: 1, refill_per_second: 1 } }\n", "plans.free.routes.api", 6),
    ("a plan's name unfit for a label", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nplans:\n  \"free plan\": {}\n", "plans.free plan", 5),
    ("a plan named like no plan", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nplans:\n  none: {}\n", "plans.none", 5),
    ("a typo in a plan", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nplans:\n  free: { connection_caps: 3 }\n", "plans.free", 5),
    ("ACME in a cluster without a secret", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\ncluster: { redis: \"redis://127.0.0.1:6379\" }\ntls:\n  acme: { directory: \"https://127.0.0.1:9/dir\", storage: /tmp/acme }\n", "cluster.secret_file", 4),
    ("a secret too short", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\ncluster:\n  redis: \"redis://127.0.0.1:6379\"\n  secret_file: /dev/null\n", "cluster.secret_file", 6),
    ("a request ID in a forwarding field", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nrequest_id:\n  header: X-Forwarded-For\n", "request_id.header", 5),
    ("a request ID in the tenant's field", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\ntenant_header: x-app\nrequest_id:\n  header: x_app\n", "request_id.header", 6),
    ("a request ID in a framing field", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nrequest_id:\n  header: content-length\n", "request_id.header", 5),
    ("a request ID in traceparent", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nrequest_id:\n  header: traceparent\n", "request_id.header", 5),
    ("tracing without a collector", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\ntracing:\n  sample_ratio: 0.5\n", "tracing.otlp_endpoint", 5),
    ("tracing to an https collector", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\ntracing:\n  otlp_endpoint: https://otel:4318\n", "tracing.otlp_endpoint", 5),
    ("tracing to no address", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\ntracing:\n  otlp_endpoint: otel:4318\n", "tracing.otlp_endpoint", 5),
    ("tracing to an IPv6 address without brackets", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\ntracing:\n  otlp_endpoint: \"http://::1:4318\"\n", "tracing.otlp_endpoint", 5),
    ("trace context as the tenant's field", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\ntenant_header: Traceparent\n", "tenant_header", 4),
    ("a sample ratio over 1", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\ntracing:\n  otlp_endpoint: http://otel:4318\n  sample_ratio: 1.5\n", "tracing.sample_ratio", 6),
    ("an empty service name", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\ntracing:\n  otlp_endpoint: http://otel:4318\n  service_name: \"\"\n", "tracing.service_name", 6),
    ("an unknown tracing field", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\ntracing:\n  otlp_endpoint: http://otel:4318\n  sampling: 1\n", "tracing", 6),
    ("a request ID field that is no name", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nrequest_id:\n  header: \"x id\"\n", "request_id.header", 5),
    ("a typo in request_id", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nrequest_id: { trust_incomin: true }\n", "request_id", 4),
    ("an unknown access format", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nlog:\n  access_format: xml\n", "log.access_format", 5),
    ("an access file for a log that is off", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\nlog:\n  access: off\n  access_path: /tmp/a.log\n", "log.access_path", 6),
    ("a secret file missing", "listen: [{ addr: 127.0.0.1:80 }]\nshards: []\ndomains: {}\ncluster:\n  redis: \"redis://127.0.0.1:6379\"\n  secret_file: /nonexistent/secret\n", "cluster.secret_file", 6),
];

/// DESIGN §7: request IDs by default in `X-Request-Id`, the text access
/// log off; asking for a format or a file turns it on.
#[test]
fn observability_defaults_and_switches() {
    let c = Config::parse(MINIMAL, None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.request_id.header.as_str(), "x-request-id");
    assert!(!c.request_id.trust_incoming);
    assert_eq!(c.log.access, None);
    assert_eq!(c.log.access_format, AccessFormat::Text);
    assert_eq!(c.log.access_path, None);
    let text = format!(
        "{MINIMAL}request_id: {{ header: X-Correlation-ID, trust_incoming: true }}\n\
         log: {{ access_format: json, access_path: /var/log/a.log }}\n"
    );
    let c = Config::parse(&text, None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.request_id.header.as_str(), "x-correlation-id");
    assert!(c.request_id.trust_incoming);
    assert_eq!(c.log.access, Some(log::Level::Info));
    assert_eq!(c.log.access_format, AccessFormat::Json);
    assert_eq!(
        c.log.access_path.as_deref(),
        Some(std::path::Path::new("/var/log/a.log"))
    );
    // The default field cannot be the tenant's either.
    let text = format!("{MINIMAL}tenant_header: X_Request_Id\n");
    let errors = Config::parse(&text, None).expect_err("refused").0;
    assert!(
        errors.iter().any(|e| e.field == "request_id.header"),
        "{errors:?}"
    );
    let text =
        format!("{MINIMAL}tenant_header: X_Request_Id\nrequest_id: {{ header: x-trace-ref }}\n");
    assert!(Config::parse(&text, None).is_ok());
    let text = format!("{MINIMAL}log: {{ access: debug, access_format: text }}\n");
    let c = Config::parse(&text, None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.log.access, Some(log::Level::Debug));
    // Tracing: off unless asked for; every trace by default, as
    // OpenTelemetry's SDKs do; the endpoint gets OTLP's path.
    assert!(c.tracing.is_none());
    let text = format!("{MINIMAL}tracing: {{ otlp_endpoint: \"http://otel:4318/\" }}\n");
    let c = Config::parse(&text, None).unwrap_or_else(|e| panic!("{e}"));
    let t = c.tracing.expect("on");
    assert_eq!(t.traces_url, "http://otel:4318/v1/traces");
    assert_eq!(t.sample_ratio, 1.0);
    assert_eq!(t.service_name, "shardgate");
}

/// Plans (DESIGN §6): a field left out is `limits`' value, `null` is no
/// limit; tenants and the default plan resolve to plans.
#[test]
fn plans_fall_back_to_limits_field_by_field() {
    let text = format!(
        "{MINIMAL}limits:\n  connection_cap: 7\n  rate: {{ tokens: 5, refill_per_second: 1 }}\n  max_body_bytes: 1000\n  \
         routes: {{ /api: {{ tokens: 2, refill_per_second: 1 }} }}\n\
         plans:\n  free: {{ connection_cap: 3 }}\n  pro: {{ rate: {{ tokens: 500, refill_per_second: 200 }}, routes: {{ /export: {{ tokens: 20, refill_per_second: 1 }} }} }}\n  \
         unlimited: {{ rate: null, connection_cap: null, max_body_bytes: null }}\n\
         tenants: {{ acme: pro, bigco: unlimited }}\ndefault_plan: free\n"
    );
    let c = Config::parse(&text, None).unwrap_or_else(|e| panic!("{e}"));
    let plans = &c.plans;
    assert_eq!(plans.plans.len(), 3);
    let free = plans.plan_of("someone").expect("the default plan");
    assert_eq!(free.name, "free");
    assert_eq!(free.connection_cap, Some(3));
    assert_eq!(free.rate, c.limits.rate, "left out: limits' rate");
    assert_eq!(free.max_body_bytes, Some(1000));
    assert_eq!(free.routes, c.limits.routes);
    let pro = plans.plan_of("acme").expect("acme's plan");
    assert_eq!((pro.rate.tokens, pro.connection_cap), (500.0, Some(7)));
    assert_eq!(pro.routes.len(), 1, "a plan's routes replace limits'");
    assert_eq!(pro.routes[0].0, "/export");
    let unlimited = plans.plan_of("bigco").expect("bigco's plan");
    assert!(unlimited.rate.is_unlimited());
    assert_eq!(
        (unlimited.connection_cap, unlimited.max_body_bytes),
        (None, None)
    );
    let none = Config::parse(MINIMAL, None).unwrap_or_else(|e| panic!("{e}"));
    assert!(none.plans.plan_of("acme").is_none(), "no plans: limits");
}

#[test]
fn broken_configurations_are_refused_naming_the_field_and_line() {
    for (what, text, field, line) in BROKEN {
        let errors = match Config::parse(text, Some("test.yaml")) {
            Ok(_) => panic!("{what}: accepted"),
            Err(e) => e.0,
        };
        let hit = errors
            .iter()
            .find(|e| e.field == *field)
            .unwrap_or_else(|| panic!("{what}: no error for `{field}` in {errors:?}"));
        assert_eq!(hit.position.map(|p| p.0), Some(*line), "{what}: {hit}");
        let shown = hit.to_string();
        assert!(
            shown.starts_with(&format!("test.yaml:{line}:")),
            "{what}: {shown}"
        );
        assert!(!hit.message.is_empty());
    }
}

#[test]
#[ignore = "prints the messages for a person to read"]
fn show_messages() {
    for (what, text, _, _) in BROKEN {
        if let Err(e) = Config::parse(text, Some("test.yaml")) {
            println!("{what}:\n{e}");
        }
    }
}

#[test]
fn the_tls_section_is_checked_field_by_field() {
    let dir = tempfile::tempdir().expect("dir");
    let base = "shards: [{ id: a, url: \"http://127.0.0.1:9\" }]\ndomains: { fallback_suffix: .localhost }\n";
    let errors = |yaml: String| match shardgate::config::Config::parse(&yaml, None) {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    };
    let e = errors(format!(
        "listen: [{{ addr: \"127.0.0.1:1\", tls: true }}]\n{base}"
    ));
    assert!(e.contains("tls"), "tls: true without the section: {e}");
    let e = errors(format!(
        "listen: [{{ addr: \"127.0.0.1:1\", tls: true }}]\n{base}tls: {{ certs: \"{}\", default_cert: nope, alpn: [h3] }}\n",
        dir.path().display()
    ));
    assert!(
        e.contains("tls.default_cert") && e.contains("tls.alpn[0]"),
        "{e}"
    );
    let e = errors(format!(
        "listen: [{{ addr: \"127.0.0.1:1\", tls: true, redirect_https: true }}]\n{base}tls: {{ certs: /no/such/dir, handshake_timeout_ms: 0, acme: {{ directory: \"http://x\" }} }}\n"
    ));
    for field in [
        "listen[0].redirect_https",
        "tls.certs",
        "tls.handshake_timeout_ms",
        "tls.acme.directory",
        "tls.acme.storage",
    ] {
        assert!(e.contains(field), "{field} not named: {e}");
    }
    assert_eq!(
        errors(format!(
            "listen: [{{ addr: \"127.0.0.1:1\", tls: true }}, {{ addr: \"127.0.0.1:2\", redirect_https: true }}]\n{base}tls: {{ certs: \"{}\", unknown_sni: refuse }}\n",
            dir.path().display()
        )),
        ""
    );
}

/// An admin token under 16 bytes is refused, naming where it came from;
/// a token (and the cluster secret) never shows in the config's debug
/// output.
#[test]
fn a_short_admin_token_is_refused_and_no_secret_is_ever_printed() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short.token");
    std::fs::write(&short, "fifteen-bytes!!\n").unwrap();
    let text = format!(
        "{MINIMAL}admin: {{ addr: 0.0.0.0:9901, token_file: {} }}\n",
        short.display()
    );
    let errors = Config::parse(&text, None).expect_err("refused").0;
    assert!(
        errors.iter().any(|e| e.field == "admin.token_file"),
        "{errors:?}"
    );
    std::env::set_var("SHARDGATE_CONFIG_SHORT_TOKEN", "short");
    let text = format!(
        "{MINIMAL}admin: {{ addr: 127.0.0.1:9901, token_env: SHARDGATE_CONFIG_SHORT_TOKEN }}\n"
    );
    let errors = Config::parse(&text, None).expect_err("refused").0;
    assert!(
        errors.iter().any(|e| e.field == "admin.token_env"),
        "{errors:?}"
    );
    let token = "a-token-of-sixteen+-bytes";
    let secret = "a-cluster-secret-of-at-least-32-bytes-long";
    let (token_file, secret_file) = (dir.path().join("t"), dir.path().join("s"));
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    std::fs::write(&secret_file, secret).unwrap();
    let text = format!(
        "{MINIMAL}admin: {{ addr: 0.0.0.0:9901, token_file: {} }}\n\
         cluster: {{ redis: \"redis://:redis-password@127.0.0.1:6379\", secret_file: {} }}\n",
        token_file.display(),
        secret_file.display()
    );
    let c = Config::parse(&text, None).unwrap_or_else(|e| panic!("{e}"));
    let token_check = c.admin.token.as_ref().expect("a token");
    assert!(token_check.matches(token.as_bytes()));
    let printed = format!("{c:?}");
    assert!(!printed.contains(token), "{printed}");
    assert!(!printed.contains(secret), "{printed}");
    assert!(!printed.contains("redis-password"), "{printed}");
}
