//! `/v1/shards`: the shards and their state, a shard added or removed,
//! and a shard drained or marked healthy or unhealthy by hand.

use super::reply::{parse, Reply};
use super::router::Call;
use super::AdminApi;
use crate::routing::{Shard, ShardId};
use http::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ShardBody {
    id: String,
    url: String,
    weight: Option<f64>,
    region: Option<String>,
    tenants: Option<Vec<String>>,
    protocol: Option<String>,
    proxy_protocol: Option<String>,
}

impl AdminApi {
    /// `/v1/shards/…` (`rest`: the segments after it); `None` for a path
    /// or method it does not serve.
    pub(super) async fn shards_endpoint(&self, call: &Call<'_>, rest: &[&str]) -> Option<Reply> {
        let reply = match (call.method, rest) {
            (&Method::GET, []) => Reply::ok(self.shards()),
            (&Method::POST, []) => self.add_shard(call.body).await,
            (&Method::DELETE, [id]) => match self.control.remove_shard(id) {
                true => Reply::ok(json!({ "removed": id })),
                false => Reply::unknown("shard", id),
            },
            (&Method::POST, [id, action]) => self.shard_action(id, action),
            _ => return None,
        };
        Some(reply)
    }

    /// `POST /v1/shards/{id}/{drain|healthy|unhealthy}`.
    fn shard_action(&self, id: &str, action: &str) -> Reply {
        let c = &self.control;
        let known = match action {
            "drain" => c.drain(id),
            "healthy" => c.mark_healthy(id),
            "unhealthy" => c.router.mark_unhealthy(id),
            _ => return Reply::error(StatusCode::NOT_FOUND, format!("no such action `{action}`")),
        };
        match known {
            true => Reply::ok(json!({ "shard": id, "action": action })),
            false => Reply::unknown("shard", id),
        }
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
                        "protocol": s.protocol.as_str(),
                        "proxy_protocol": s.proxy_protocol.then_some("v2"),
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
        let tls = match crate::config::parse_shard_url(&b.url) {
            Ok((tls, _, _)) => tls,
            Err(e) => return Reply::error(StatusCode::BAD_REQUEST, format!("url: {e}")),
        };
        let protocol = match crate::config::shard_protocol(b.protocol.as_deref(), tls) {
            Ok(protocol) => protocol,
            Err(e) => return Reply::error(StatusCode::BAD_REQUEST, format!("protocol: {e}")),
        };
        let fast_path = self.control.config.server.fast_path;
        let proxied =
            crate::config::shard_proxy_protocol(b.proxy_protocol.as_deref(), protocol, fast_path);
        let proxy_protocol = match proxied {
            Ok(on) => on,
            Err(e) => return Reply::error(StatusCode::BAD_REQUEST, format!("proxy_protocol: {e}")),
        };
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
            protocol,
            proxy_protocol,
        };
        match self.control.add_shard_resolved(shard).await {
            Ok(true) => Reply::json(StatusCode::CREATED, json!({ "added": b.id })),
            Ok(false) => Reply::error(StatusCode::CONFLICT, format!("shard `{}` exists", b.id)),
            Err(e) => Reply::error(StatusCode::BAD_REQUEST, e),
        }
    }
}
