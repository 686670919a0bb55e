//! The counts: `/metrics` in Prometheus' text format (from the collector,
//! read at scrape time) and `GET /v1/metrics` as JSON.

use super::reply::Reply;
use super::AdminApi;
use http::StatusCode;
use pingora::protocols::http::ServerSession;
use serde_json::{json, Value};

impl AdminApi {
    /// `GET /metrics`: for a `Host` that is an address, or with the token.
    pub(super) fn scrape(&self, session: &ServerSession) -> Reply {
        if !self.may_scrape(session) {
            return Reply::error(
                StatusCode::FORBIDDEN,
                "address this listener by IP or localhost, or send the bearer token",
            );
        }
        Reply::text(
            StatusCode::OK,
            crate::collector::render(&self.registry),
            "text/plain; version=0.0.4",
        )
    }

    /// `GET /v1/metrics`.
    pub(super) fn metrics_json(&self) -> Value {
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
}
