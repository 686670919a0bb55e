//! `limits`: the gateway-wide caps on connections, rates, heads, bodies
//! and timeouts.

use super::Checker;
use crate::config::raw::RawLimits;
use crate::config::LimitsConfig;
use crate::limits::RateRule;

/// 100 MiB, Cloudflare's free-plan limit.
const DEFAULT_MAX_BODY_BYTES: u64 = 100 * 1024 * 1024;

pub(super) fn check_limits(c: &mut Checker<'_>, l: RawLimits) -> LimitsConfig {
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
    let max_tracked_tenants = table_bound(
        c,
        "limits.max_tracked_tenants",
        l.max_tracked_tenants,
        crate::limits::DEFAULT_MAX_TRACKED,
    );
    let max_tracked_clients = table_bound(
        c,
        "limits.max_tracked_clients",
        l.max_tracked_clients,
        crate::limits::DEFAULT_MAX_TRACKED_CLIENTS,
    );
    let per_client = (l.per_client.as_ref()).map_or(RateRule::UNLIMITED, |p| {
        c.rate("limits.per_client.rate", &p.rate)
    });
    LimitsConfig {
        max_tracked_tenants,
        per_client,
        max_tracked_clients,
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

/// A table's bound (`max_tracked_*`): 64 to 100 000 000 entries.
fn table_bound(c: &mut Checker<'_>, field: &str, value: Option<u64>, default: usize) -> usize {
    match value {
        None => default,
        Some(n @ 64..=100_000_000) => n as usize,
        Some(_) => {
            c.error(field, "must be between 64 and 100000000");
            default
        }
    }
}
