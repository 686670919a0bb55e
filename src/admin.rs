//! The admin API (DESIGN §2): JSON over HTTP on `admin.addr`. `/healthz`
//! is open, `/metrics` too for a `Host` that is an IP address or
//! `localhost` (else it needs the token: DNS rebinding); everything under
//! `/v1/` needs `Authorization: Bearer <token>` (compared digest to
//! digest, in constant time) unless no token is configured, which
//! validation allows only on loopback. Bad JSON,
//! unknown fields or ids answer 400/404 with a message, and nothing is half
//! applied: each request is validated whole before it changes anything.

use crate::config::{redact, AdminToken};
use crate::control::{Control, PlanChangeError};
use crate::proxy::pipeline::routes::RoutePrefixes;
use crate::routing::top;
use crate::routing::{RouteRequest, Shard, ShardId};
use crate::state::{self, StateSnapshot};
use http::{Method, Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// Largest request body the admin API reads.
pub const MAX_BODY: usize = 1024 * 1024;

/// The operator's page, built into the binary (no build step, no CDN).
const PAGE_HTML: &str = include_str!("ui/index.html");
const PAGE_JS: &str = include_str!("ui/app.js");
const PAGE_CSS: &str = include_str!("ui/app.css");
/// Everything the admin listener serves may load only its own script and
/// style and talk only to itself; no page may frame it.
const PAGE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

pub struct AdminApi {
    control: Arc<Control>,
    routes: RoutePrefixes,
    registry: prometheus::Registry,
}

impl AdminApi {
    pub fn new(control: Arc<Control>) -> Self {
        let registry = prometheus::Registry::new();
        if let Err(e) = registry.register(Box::new(crate::collector::ShardgateCollector::new(
            &control,
        ))) {
            log::error!("cannot register metrics: {e}");
        }
        AdminApi {
            routes: RoutePrefixes::new(control.config.route_prefixes()),
            control,
            registry,
        }
    }
}

/// An answer: status and JSON (or text) body.
struct Reply {
    status: StatusCode,
    body: Vec<u8>,
    content_type: &'static str,
}

impl Reply {
    fn json(status: StatusCode, value: Value) -> Reply {
        Reply {
            status,
            body: serde_json::to_vec(&value).unwrap_or_default(),
            content_type: "application/json",
        }
    }

    fn ok(value: Value) -> Reply {
        Reply::json(StatusCode::OK, value)
    }

    fn error(status: StatusCode, message: impl Into<String>) -> Reply {
        Reply::json(status, json!({ "error": message.into() }))
    }

    fn asset(body: &'static str, content_type: &'static str) -> Reply {
        Reply {
            status: StatusCode::OK,
            body: body.as_bytes().to_vec(),
            content_type,
        }
    }

    fn text(status: StatusCode, body: String, content_type: &'static str) -> Reply {
        Reply {
            status,
            body: body.into_bytes(),
            content_type,
        }
    }
}

/// Without a token, `/v1/` answers only what cannot come from a web page
/// of another site: the `Host` must name the loopback (not a name an
/// attacker's DNS points at 127.0.0.1: DNS rebinding), and a browser's
/// `Sec-Fetch-Site` and `Origin`, when sent, must say the admin's own
/// page. (With a token, a cross-site page cannot send the
/// `Authorization` header without a CORS preflight, which is never
/// granted.)
fn from_this_machine_not_another_site(req: &pingora::http::RequestHeader) -> bool {
    let header = |name: &str| lowercase_header(req, name);
    let host = header("host").unwrap_or_default();
    let name = host_name(&host);
    let loopback = name == "localhost"
        || name == "[::1]"
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback());
    let same_site = match header("sec-fetch-site").as_deref() {
        None | Some("same-origin") | Some("none") => true,
        Some(_) => false,
    };
    let same_origin = match header("origin") {
        None => true,
        Some(origin) => origin == format!("http://{host}"),
    };
    loopback && same_site && same_origin
}

/// Whether the request's `Host` is an IP address or `localhost`: never a
/// name, so never a page whose DNS an attacker re-pointed at this
/// listener (DNS rebinding), which is how a browser would be made to read
/// `/metrics` for another site. Scrapers address the listener by IP (or
/// send the bearer token).
fn host_is_an_address(req: &pingora::http::RequestHeader) -> bool {
    let host = lowercase_header(req, "host").unwrap_or_default();
    let name = host_name(&host);
    let v6 = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok());
    name == "localhost" || v6 || name.parse::<std::net::Ipv4Addr>().is_ok()
}

fn lowercase_header(req: &pingora::http::RequestHeader, name: &str) -> Option<String> {
    (req.headers.get(name))
        .and_then(|v| v.to_str().ok())
        .map(str::to_ascii_lowercase)
}

/// A `Host` value without its port.
fn host_name(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Whether the request carries `Authorization: Bearer <token>`.
fn bears(req: &pingora::http::RequestHeader, token: &AdminToken) -> bool {
    let header = (req.headers.get(http::header::AUTHORIZATION))
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    let given = header.strip_prefix(b"Bearer ").unwrap_or(b"");
    token.matches(given)
}

/// `%XX` decoding of one path segment.
fn decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn query_params(query: Option<&str>) -> Vec<(String, String)> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let plus = |s: &str| s.replace('+', " ");
            (
                decode(&plus(k)).unwrap_or_default(),
                decode(&plus(v)).unwrap_or_default(),
            )
        })
        .collect()
}

/// The first value of query parameter `name`.
fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, Reply> {
    serde_json::from_slice(body)
        .map_err(|e| Reply::error(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantBody {
    tenant: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegionBody {
    region: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanBody {
    plan: String,
}

/// A rate as the admin API shows it (`null`: no limit).
fn rate_json(rule: &crate::limits::RateRule) -> serde_json::Value {
    match rule.is_unlimited() {
        true => serde_json::Value::Null,
        false => json!({ "tokens": rule.tokens, "refill_per_second": rule.refill_per_second }),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ShardBody {
    id: String,
    url: String,
    weight: Option<f64>,
    region: Option<String>,
    tenants: Option<Vec<String>>,
}

impl AdminApi {
    fn authorized(&self, session: &ServerSession) -> bool {
        let Some(token) = &self.control.config.admin.token else {
            // Loopback only (checked by validation), but a browser on this
            // machine could still be made to call it by another site.
            return from_this_machine_not_another_site(session.req_header());
        };
        bears(session.req_header(), token)
    }

    /// `/metrics` answers a `Host` that is an address, or the bearer token.
    fn may_scrape(&self, session: &ServerSession) -> bool {
        let req = session.req_header();
        let token = self.control.config.admin.token.as_ref();
        host_is_an_address(req) || token.is_some_and(|t| bears(req, t))
    }

    fn shards(&self) -> Value {
        Value::Array(
            self.control
                .router
                .shards()
                .into_iter()
                .map(|(s, status, active)| {
                    json!({
                        "id": s.id, "url": s.url, "weight": s.weight, "region": s.region,
                        "tenants": s.tenants, "healthy": status.healthy,
                        "draining": status.draining, "active": active,
                    })
                })
                .collect(),
        )
    }

    async fn add_shard(&self, body: &[u8]) -> Reply {
        let b: ShardBody = match parse(body) {
            Ok(b) => b,
            Err(r) => return r,
        };
        if b.id.is_empty() {
            return Reply::error(StatusCode::BAD_REQUEST, "id: must not be empty");
        }
        if let Err(e) = crate::config::parse_shard_url(&b.url) {
            return Reply::error(StatusCode::BAD_REQUEST, format!("url: {e}"));
        }
        let weight = b.weight.unwrap_or(1.0);
        if !weight.is_finite() || weight < 0.0 {
            return Reply::error(
                StatusCode::BAD_REQUEST,
                "weight: must be a finite number ≥ 0",
            );
        }
        if let (Some(region), Some(directory)) = (&b.region, &self.control.regions) {
            if !directory.has_region(region) {
                return Reply::error(
                    StatusCode::BAD_REQUEST,
                    format!("region: unknown region `{region}`"),
                );
            }
        }
        let shard = Shard {
            id: ShardId::new(&b.id),
            url: b.url,
            weight,
            region: b.region,
            tenants: b.tenants,
        };
        match self.control.add_shard_resolved(shard).await {
            Ok(true) => Reply::json(StatusCode::CREATED, json!({ "added": b.id })),
            Ok(false) => Reply::error(StatusCode::CONFLICT, format!("shard `{}` exists", b.id)),
            Err(e) => Reply::error(StatusCode::BAD_REQUEST, e),
        }
    }

    fn explain(&self, query: Option<&str>) -> Reply {
        let params = query_params(query);
        let get = |name: &str| param(&params, name);
        let Some(tenant) = get("tenant").filter(|t| !t.is_empty()) else {
            return Reply::error(StatusCode::BAD_REQUEST, "tenant: required");
        };
        let region = match (get("region"), &self.control.regions) {
            (Some(r), _) => Some(r.to_string()),
            (None, Some(directory)) => Some(directory.peek_region_for(tenant)),
            (None, None) => None,
        };
        let found = get("path")
            .map(|p| self.routes.route_for(p))
            .unwrap_or_default();
        let name = |i: Option<usize>| i.map(|i| self.routes.name(i));
        let request = RouteRequest {
            tenant,
            channel: get("channel"),
            route: name(found.longest),
            route_also: name(found.other),
            region: region.as_deref(),
            balance: None,
            exclude: &[],
        };
        let r = self.control.router.explain(&request);
        let plans = self.control.router.plans();
        Reply::ok(json!({
            "decision": r.decision,
            "shard": r.shard_id(),
            "plan": plans.plan_of(tenant).and_then(|i| plans.name(i)),
            "region": region,
            "bucket": r.bucket.map(|b| b.name().to_string()),
            "retry_after": r.retry_after_secs.map(|s| (s.ceil() as u64).max(1)),
        }))
    }

    fn restore(&self, query: Option<&str>, body: &[u8]) -> Reply {
        let snapshot: StateSnapshot = match parse(body) {
            Ok(s) => s,
            Err(r) => return r,
        };
        let reset = query_params(query)
            .iter()
            .any(|(k, v)| k == "reset_connections" && v != "false" && v != "0");
        let mut router = snapshot.router;
        router.shift_time(self.control.router.clock().now_ms() - snapshot.written_at_ms);
        self.control.router.restore(&router, reset);
        if let (Some(directory), Some(regions)) = (&self.control.regions, &snapshot.regions) {
            directory.restore(regions);
        }
        Reply::ok(json!({ "restored": true, "reset_connections": reset }))
    }

    /// `GET /v1/cluster`: this node, the nodes last seen, Redis' status.
    fn cluster(&self) -> Value {
        let Some(cluster) = &self.control.cluster else {
            return json!({ "enabled": false });
        };
        // Stamps are Redis' clock: ages too, never this node's.
        let now = cluster.redis_now_ms();
        let alive = cluster.alive_ids();
        let nodes: Vec<Value> = cluster
            .nodes()
            .into_iter()
            .map(|n| {
                json!({
                    "alive": alive.contains(&n.id),
                    "id": n.id,
                    "last_seen_ms": n.last_seen_ms,
                    "last_seen_ago_ms": now.saturating_sub(n.last_seen_ms),
                })
            })
            .collect();
        let config = &cluster.config;
        json!({
            "enabled": true,
            "node_id": config.node_id,
            "redis": {
                "up": cluster.redis_up(),
                "target": match &config.redis {
                    crate::config::RedisTarget::Single(url) => json!(redact(url)),
                    crate::config::RedisTarget::Cluster(urls) =>
                        json!(urls.iter().map(|u| redact(u)).collect::<Vec<_>>()),
                },
            },
            "nodes_alive": cluster.nodes_alive(),
            "region_lists": self.control.regions.as_ref().map(|_| cluster.region_lists()),
            "nodes": nodes,
            "sync_interval_ms": config.sync_interval.as_millis() as u64,
            "on_redis_down": config.on_redis_down.as_str(),
            "mode": format!("{:?}", cluster.mode()).to_lowercase(),
            "sync_errors": cluster.sync_errors(),
        })
    }

    /// `GET /v1/certs`: every certificate served (name, SANs, issuer,
    /// expiry, source), the files skipped, and ACME's work per host.
    fn certs(&self) -> Reply {
        let edge = &self.control.edge;
        let Some(store) = &edge.store else {
            return Reply::ok(json!({ "certs": [], "errors": [], "acme": null }));
        };
        let (mut certs, errors) = store.list();
        certs.sort_by(|a, b| a.name.cmp(&b.name).then(a.expires.cmp(&b.expires)));
        let acme = edge.config.acme.as_ref().map(|a| {
            json!({
                "directory": a.directory,
                "account_error": *edge.acme.account_error.lock(),
                "hosts": edge.acme.hosts(),
            })
        });
        Reply::ok(json!({ "certs": certs, "errors": errors, "acme": acme }))
    }

    fn metrics_json(&self) -> Value {
        let c = &self.control;
        let failures: Vec<Value> = c
            .metrics
            .upstream_failures()
            .into_iter()
            .map(|((shard, kind), count)| json!({ "shard": shard, "kind": kind, "count": count }))
            .collect();
        let durations = c.metrics.durations();
        json!({
            "router": c.router.metrics(),
            "domains": c.domains.metrics(),
            "regions": c.regions.as_ref().map(|d| d.metrics()),
            "retries": c.metrics.retries(),
            "upstream_failures": failures,
            "request_duration_seconds": {
                "buckets": durations.buckets,
                "count": durations.count,
                "sum": durations.sum,
            },
        })
    }

    /// `GET /v1/tenants/top?by=refused&n=10`: the tenants refused most over
    /// the last minute (`routing::top`); `n` is 1–[`top::CAPACITY`].
    fn top_tenants(&self, query: Option<&str>) -> Reply {
        let params = query_params(query);
        let get = |name: &str| param(&params, name);
        match get("by") {
            None | Some("refused") => {}
            Some(other) => {
                return Reply::error(
                    StatusCode::BAD_REQUEST,
                    format!("by: unknown ranking `{other}` (known: refused)"),
                )
            }
        }
        let n = match get("n").map(str::parse::<usize>) {
            None => 10,
            Some(Ok(n)) if (1..=top::CAPACITY).contains(&n) => n,
            Some(_) => {
                return Reply::error(
                    StatusCode::BAD_REQUEST,
                    format!("n: must be an integer from 1 to {}", top::CAPACITY),
                )
            }
        };
        let plans = self.control.router.plans();
        let tenants: Vec<Value> = (self.control.router.top_refused(n).into_iter())
            .map(|t| {
                let plan = plans.plan_of(&t.tenant).and_then(|i| plans.name(i));
                let mut entry = json!(t);
                entry["plan"] = json!(plan);
                entry
            })
            .collect();
        Reply::ok(json!({
            "by": "refused",
            "window_seconds": top::SLOT_MS * top::SLOTS as u64 / 1000,
            "tenants": tenants,
        }))
    }

    /// `GET /v1/plans`: each plan's limits, `limits`' value where it left
    /// a field out.
    fn plans(&self) -> serde_json::Value {
        let plans = self.control.config.plans.plans.iter().map(|p| {
            let routes: serde_json::Map<String, serde_json::Value> = (p.routes.iter())
                .map(|(prefix, rule)| (prefix.clone(), rate_json(rule)))
                .collect();
            let fields = json!({
                "rate": rate_json(&p.rate),
                "connection_cap": p.connection_cap,
                "max_body_bytes": p.max_body_bytes,
                "routes": routes,
            });
            (p.name.clone(), fields)
        });
        serde_json::Value::Object(plans.collect())
    }

    /// A plan change's answer: the tenant as it is now, or why not (409
    /// past the bound on runtime changes: put the rest in `tenants`).
    fn plan_changed(&self, tenant: &str, changed: Result<(), PlanChangeError>) -> Reply {
        match changed {
            Ok(()) => Reply::ok(self.tenant(tenant)),
            Err(e @ PlanChangeError::Full) => Reply::error(StatusCode::CONFLICT, e.to_string()),
            Err(e) => Reply::error(StatusCode::BAD_REQUEST, e.to_string()),
        }
    }

    /// `GET /v1/tenants/{tenant}`: its plan and the limits it is held to.
    fn tenant(&self, tenant: &str) -> serde_json::Value {
        let plans = self.control.router.plans();
        let plan = plans.plan_of(tenant);
        let limits = plans.limits_for(tenant);
        let max_body = self.control.config.max_body_of(plan);
        json!({
            "tenant": tenant,
            "plan": plan.and_then(|i| plans.name(i)),
            "limits": {
                "rate": rate_json(limits.rate()),
                "connection_cap": limits.connection_cap(),
                "max_body_bytes": max_body,
            },
        })
    }

    async fn route(&self, method: &Method, path: &str, query: Option<&str>, body: &[u8]) -> Reply {
        let segments: Vec<Option<String>> = path
            .trim_start_matches('/')
            .split('/')
            .map(decode)
            .collect();
        let Some(segments) = segments.into_iter().collect::<Option<Vec<String>>>() else {
            return Reply::error(
                StatusCode::BAD_REQUEST,
                "invalid percent-encoding in the path",
            );
        };
        let s: Vec<&str> = segments.iter().map(String::as_str).collect();
        let c = &self.control;
        let not_found = |what: &str, id: &str| {
            Reply::error(StatusCode::NOT_FOUND, format!("unknown {what} `{id}`"))
        };
        match (method, s.as_slice()) {
            (&Method::GET, ["v1", "shards"]) => Reply::ok(self.shards()),
            (&Method::POST, ["v1", "shards"]) => self.add_shard(body).await,
            (&Method::DELETE, ["v1", "shards", id]) => match c.remove_shard(id) {
                true => Reply::ok(json!({ "removed": id })),
                false => not_found("shard", id),
            },
            (&Method::POST, ["v1", "shards", id, action]) => {
                let known = match *action {
                    "drain" => c.drain(id),
                    "healthy" => c.mark_healthy(id),
                    "unhealthy" => c.router.mark_unhealthy(id),
                    _ => {
                        return Reply::error(
                            StatusCode::NOT_FOUND,
                            format!("no such action `{action}`"),
                        )
                    }
                };
                match known {
                    true => Reply::ok(json!({ "shard": id, "action": action })),
                    false => not_found("shard", id),
                }
            }
            (&Method::GET, ["v1", "domains"]) => Reply::ok(json!(c.domains.list())),
            (&Method::PUT, ["v1", "domains", host]) => match parse::<TenantBody>(body) {
                Err(r) => r,
                Ok(b) if b.tenant.is_empty() => {
                    Reply::error(StatusCode::BAD_REQUEST, "tenant: must not be empty")
                }
                Ok(b) => match c.put_domain(host, &b.tenant) {
                    Ok(()) => Reply::ok(json!({ "host": host, "tenant": b.tenant })),
                    Err(e) => Reply::error(StatusCode::BAD_REQUEST, e),
                },
            },
            (&Method::DELETE, ["v1", "domains", host]) => match c.delete_domain(host) {
                true => Reply::ok(json!({ "removed": host })),
                false => not_found("domain", host),
            },
            (&Method::PUT, ["v1", "tenants", tenant, "region"]) => {
                if c.regions.is_none() {
                    return Reply::error(StatusCode::NOT_FOUND, "no regions are configured");
                }
                match parse::<RegionBody>(body) {
                    Err(r) => r,
                    Ok(b) => match c.assign_region(tenant, &b.region) {
                        Ok(()) => Reply::ok(json!({ "tenant": tenant, "region": b.region })),
                        Err(e) => Reply::error(StatusCode::BAD_REQUEST, e),
                    },
                }
            }
            (&Method::DELETE, ["v1", "tenants", tenant, "region"]) => match &c.regions {
                None => Reply::error(StatusCode::NOT_FOUND, "no regions are configured"),
                Some(_) => match c.release_region(tenant) {
                    true => Reply::ok(json!({ "released": tenant })),
                    false => not_found("region assignment for tenant", tenant),
                },
            },
            (&Method::GET, ["v1", "cluster"]) => Reply::ok(self.cluster()),
            (&Method::GET, ["v1", "certs"]) => self.certs(),
            (&Method::POST, ["v1", "certs", "reload"]) => match &c.edge.store {
                None => Reply::error(StatusCode::NOT_FOUND, "no `tls` section is configured"),
                // The admin API runs on its own threads: reading the
                // directory here holds up no request.
                Some(store) => Reply::ok(json!(store.reload())),
            },
            (&Method::GET, ["v1", "tenants", "top"]) => self.top_tenants(query),
            (&Method::GET, ["v1", "tenants", "denied"]) => Reply::ok(json!(c.router.denied())),
            (&Method::PUT, ["v1", "tenants", tenant, "deny"]) => {
                c.deny(tenant);
                Reply::ok(json!({ "denied": tenant }))
            }
            (&Method::DELETE, ["v1", "tenants", tenant, "deny"]) => match c.undeny(tenant) {
                true => Reply::ok(json!({ "allowed": tenant })),
                false => not_found("denied tenant", tenant),
            },
            (&Method::GET, ["v1", "plans"]) => Reply::ok(self.plans()),
            (&Method::GET, ["v1", "tenants", tenant]) => Reply::ok(self.tenant(tenant)),
            (&Method::PUT, ["v1", "tenants", tenant, "plan"]) => match parse::<PlanBody>(body) {
                Err(r) => r,
                Ok(b) => self.plan_changed(tenant, c.set_plan(tenant, Some(&b.plan))),
            },
            (&Method::DELETE, ["v1", "tenants", tenant, "plan"]) => {
                self.plan_changed(tenant, c.set_plan(tenant, None))
            }
            (&Method::GET, ["v1", "route"]) => self.explain(query),
            (&Method::GET, ["v1", "snapshot"]) => Reply::ok(json!(state::capture(c))),
            (&Method::POST, ["v1", "restore"]) => self.restore(query, body),
            (&Method::GET, ["v1", "metrics"]) => Reply::ok(self.metrics_json()),
            (_, ["v1", ..]) => Reply::error(
                StatusCode::NOT_FOUND,
                format!("no such endpoint: {method} {path}"),
            ),
            _ => Reply::error(StatusCode::NOT_FOUND, "not found"),
        }
    }

    async fn read_body(session: &mut ServerSession) -> Result<Vec<u8>, Reply> {
        let mut body = Vec::new();
        loop {
            match session.read_request_body().await {
                Ok(Some(chunk)) => {
                    body.extend_from_slice(&chunk);
                    if body.len() > MAX_BODY {
                        return Err(Reply::error(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            "body too large",
                        ));
                    }
                }
                Ok(None) => return Ok(body),
                Err(e) => {
                    return Err(Reply::error(
                        StatusCode::BAD_REQUEST,
                        format!("cannot read the body: {e}"),
                    ))
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl ServeHttp for AdminApi {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        // The gateway's own deadlines for a body, a client that does not
        // read its answer, and the body read off after it: no connection
        // holds one of the listener's places longer.
        let limits = &self.control.config.limits;
        session.set_read_timeout(Some(limits.body_timeout));
        session.set_write_timeout(Some(limits.send_timeout));
        session.set_total_drain_timeout(Some(limits.body_timeout));
        let req = session.req_header();
        let method = req.method.clone();
        let path = req.uri.path().to_string();
        let query = req.uri.query().map(str::to_string);
        let reply = match (&method, path.as_str()) {
            (&Method::GET, "/healthz") => Reply::text(StatusCode::OK, "ok\n".into(), "text/plain"),
            // The operator's page (src/ui): static, no data in it; its
            // script reads `/v1/` with the token.
            (&Method::GET, "/") => Reply::asset(PAGE_HTML, "text/html; charset=utf-8"),
            (&Method::GET, "/ui/app.js") => Reply::asset(PAGE_JS, "text/javascript; charset=utf-8"),
            (&Method::GET, "/ui/app.css") => Reply::asset(PAGE_CSS, "text/css; charset=utf-8"),
            (&Method::GET, "/ui/auth") => Reply::ok(json!({
                "token_required": self.control.config.admin.token.is_some(),
            })),
            (&Method::GET, "/metrics") if !self.may_scrape(session) => Reply::error(
                StatusCode::FORBIDDEN,
                "address this listener by IP or localhost, or send the bearer token",
            ),
            (&Method::GET, "/metrics") => Reply::text(
                StatusCode::OK,
                crate::collector::render(&self.registry),
                "text/plain; version=0.0.4",
            ),
            (_, p) if p.starts_with("/v1/") || p == "/v1" => {
                if !self.authorized(session) {
                    Reply::error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token")
                } else {
                    match Self::read_body(session).await {
                        Ok(body) => self.route(&method, &path, query.as_deref(), &body).await,
                        Err(reply) => reply,
                    }
                }
            }
            _ => Reply::error(StatusCode::NOT_FOUND, "not found"),
        };
        let mut builder = Response::builder()
            .status(reply.status)
            .header("content-type", reply.content_type)
            .header("content-length", reply.body.len().to_string())
            .header("cache-control", "no-store")
            .header("x-content-type-options", "nosniff")
            .header("referrer-policy", "no-referrer")
            .header("content-security-policy", PAGE_CSP);
        if reply.status == StatusCode::UNAUTHORIZED {
            builder = builder.header("www-authenticate", "Bearer");
        }
        builder
            .body(reply.body)
            .unwrap_or_else(|_| Response::new(Vec::new()))
    }
}

impl std::fmt::Debug for AdminApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminApi")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        let token = AdminToken::new(b"secret-of-16-bytes");
        assert!(token.matches(b"secret-of-16-bytes"));
        assert!(!token.matches(b"secret-of-16-byte"));
        assert!(!token.matches(b"secret-of-16-bytes!"));
        assert!(!token.matches(b""));
        assert!(!token.matches(b"Secret-of-16-bytes"));
        assert_eq!(format!("{token:?}"), "AdminToken(..)", "never printed");
    }

    #[test]
    fn metrics_answer_an_address_not_a_name() {
        let req = |host: Option<&str>| {
            let mut r = pingora::http::RequestHeader::build("GET", b"/metrics", None).expect("req");
            if let Some(host) = host {
                r.insert_header("host", host).expect("header");
            }
            host_is_an_address(&r)
        };
        for host in [
            "127.0.0.1:9901",
            "10.0.0.5",
            "[::1]:9901",
            "[fd00::5]",
            "LocalHost:1",
        ] {
            assert!(req(Some(host)), "{host}");
        }
        for host in [
            "evil.example:9901",
            "127.0.0.1.nip.io",
            "[evil]",
            "",
            "localhost.evil",
        ] {
            assert!(!req(Some(host)), "{host}");
        }
        assert!(!req(None));
    }

    #[test]
    fn an_open_admin_answers_its_own_page_not_another_sites() {
        let req = |headers: &[(&str, &str)]| {
            let mut r =
                pingora::http::RequestHeader::build("POST", b"/v1/shards", None).expect("request");
            for (k, v) in headers {
                r.insert_header(k.to_string(), v.to_string())
                    .expect("header");
            }
            from_this_machine_not_another_site(&r)
        };
        assert!(req(&[("host", "127.0.0.1:9901")]));
        assert!(req(&[
            ("host", "localhost:9901"),
            ("sec-fetch-site", "same-origin"),
            ("origin", "http://localhost:9901")
        ]));
        assert!(req(&[("host", "[::1]:9901"), ("sec-fetch-site", "none")]));
        assert!(!req(&[("host", "evil.example:9901")]), "DNS rebinding");
        assert!(!req(&[
            ("host", "127.0.0.1:9901"),
            ("sec-fetch-site", "cross-site")
        ]));
        assert!(!req(&[
            ("host", "127.0.0.1:9901"),
            ("origin", "http://evil.example")
        ]));
        assert!(!req(&[]));
    }

    #[test]
    fn path_segments_and_queries_decode() {
        assert_eq!(decode("%2A.acme.com").as_deref(), Some("*.acme.com"));
        assert_eq!(decode("%zz"), None);
        let q = query_params(Some("tenant=a%20b&channel=&path=/api/export"));
        assert_eq!(q[0], ("tenant".into(), "a b".into()));
        assert_eq!(q[1], ("channel".into(), "".into()));
    }
}
