//! `retry`, `upstream` and `health`: how shardgate talks to shards, and
//! when it tries again or gives one up.

use super::Checker;
use crate::config::raw::{RawHealth, RawRetry, RawUpstream, Switch};
use crate::config::{HealthConfig, LivenessConfig, RetryConfig, UpstreamConfig};
use http::Method;

pub(super) fn check_retry(c: &mut Checker<'_>, r: Switch<RawRetry>) -> RetryConfig {
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

pub(super) fn check_upstream(c: &mut Checker<'_>, u: RawUpstream) -> UpstreamConfig {
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

pub(super) fn check_health(c: &mut Checker<'_>, h: RawHealth) -> HealthConfig {
    HealthConfig {
        interval: c.positive_ms("health.interval_ms", h.interval_ms, 2000),
        timeout: c.positive_ms("health.timeout_ms", h.timeout_ms, 1000),
        fall: c.at_least_one("health.fall", h.fall, 3),
        rise: c.at_least_one("health.rise", h.rise, 2),
    }
}
