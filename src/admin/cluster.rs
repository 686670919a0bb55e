//! `GET /v1/cluster`: this node, the nodes it sees, Redis' status.

use super::AdminApi;
use crate::config::redact;
use serde_json::{json, Value};

impl AdminApi {
    /// `GET /v1/cluster`: this node, the nodes last seen, Redis' status.
    pub(super) fn cluster(&self) -> Value {
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
}
