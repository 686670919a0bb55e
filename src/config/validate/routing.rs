//! `regions`, `shards`, `routing` and `domains`: where a request's
//! tenant comes from and which shard serves it.

use super::Checker;
use crate::config::raw::{RawDomains, RawRegion, RawRouting, RawShard};
use crate::config::{DomainsConfig, HashKind, LoadKind, RoutingConfig};
use crate::routing::{Balance, DomainMap, Fallback, Region, Shard, ShardProtocol};
use http::HeaderName;
use std::collections::BTreeSet;
use std::net::ToSocketAddrs;

pub(super) fn check_regions(
    c: &mut Checker<'_>,
    regions: Option<Vec<RawRegion>>,
) -> Option<Vec<Region>> {
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
        unique_id(c, &format!("regions[{i}].id"), "region", &r.id, &mut seen);
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

/// A shard's `protocol` (DESIGN §8) for a shard whose URL is `https`
/// when `tls`: `http1` when absent.
pub fn shard_protocol(name: Option<&str>, tls: bool) -> Result<ShardProtocol, String> {
    let Some(name) = name else {
        return Ok(ShardProtocol::Http1);
    };
    match ShardProtocol::parse(name) {
        None => Err(format!("`{name}`: must be http1, h2 or auto")),
        Some(ShardProtocol::Auto) if !tls => Err(
            "auto needs an https url (the shard picks its protocol through ALPN); \
             h2 speaks HTTP/2 to an http url with prior knowledge"
                .to_string(),
        ),
        Some(protocol) => Ok(protocol),
    }
}

/// A shard's `proxy_protocol` (DESIGN §10): `v2`, to a shard spoken to in
/// HTTP/1.1 (an HTTP/2 connection carries many clients' streams, and one
/// header names one client), by the fast transport (Pingora's path pools
/// connections across clients).
pub fn shard_proxy_protocol(
    value: Option<&str>,
    protocol: ShardProtocol,
    fast_path: bool,
) -> Result<bool, String> {
    match value {
        None => Ok(false),
        Some("v2") if protocol != ShardProtocol::Http1 => {
            Err("needs protocol: http1 (an HTTP/2 connection carries many clients' streams)".into())
        }
        Some("v2") if !fast_path => {
            Err("needs server.fast_path (Pingora's path shares connections between clients)".into())
        }
        Some("v2") => Ok(true),
        Some(other) => Err(format!("`{other}`: only v2 is sent")),
    }
}

/// An id (`what`: region, shard) must be there and be the only one.
fn unique_id(c: &mut Checker<'_>, field: &str, what: &str, id: &str, seen: &mut BTreeSet<String>) {
    if id.is_empty() {
        c.error(field, "must not be empty");
    } else if !seen.insert(id.to_string()) {
        c.error(field, format!("duplicate {what} id `{id}`"));
    }
}

pub(super) fn check_shards(
    c: &mut Checker<'_>,
    shards: Vec<RawShard>,
    regions: Option<&[Region]>,
    fast_path: bool,
) -> Vec<Shard> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (i, s) in shards.into_iter().enumerate() {
        unique_id(c, &format!("shards[{i}].id"), "shard", &s.id, &mut seen);
        let mut protocol = ShardProtocol::Http1;
        match parse_shard_url(&s.url) {
            Ok((tls, host, port)) => {
                match shard_protocol(s.protocol.as_deref(), tls) {
                    Ok(p) => protocol = p,
                    Err(msg) => c.error(format!("shards[{i}].protocol"), msg),
                }
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
        let proxied = shard_proxy_protocol(s.proxy_protocol.as_deref(), protocol, fast_path);
        let proxy_protocol = proxied.unwrap_or_else(|msg| {
            c.error(format!("shards[{i}].proxy_protocol"), msg);
            false
        });
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
            protocol,
            proxy_protocol,
        });
    }
    out
}

pub(super) fn check_routing(c: &mut Checker<'_>, r: RawRouting) -> RoutingConfig {
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

pub(super) fn check_domains(c: &mut Checker<'_>, d: RawDomains) -> DomainsConfig {
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

/// `tenant_header`: the field that names the tenant, when the host does not.
pub(super) fn check_tenant_header(c: &mut Checker<'_>, name: Option<&str>) -> HeaderName {
    let tenant_header = name
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
    tenant_header
}
