//! `cluster`: the Redis the nodes share, this node's name, the shared
//! secret.

use super::{warn_if_others_can_read, Checker};
use crate::config::raw::{OneOrMany, RawCluster, RawState, Switch};
use crate::config::{ClusterConfig, OnRedisDown, RedisTarget, Secret, StateConfig};
use std::path::PathBuf;

pub(super) fn check_cluster(c: &mut Checker<'_>, r: RawCluster) -> ClusterConfig {
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
            Some(Secret(bytes.trim_ascii().into()))
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

/// `state`: the file this node saves its counters to between restarts.
pub(super) fn check_state(c: &mut Checker<'_>, state: Switch<RawState>) -> Option<StateConfig> {
    match state {
        Switch::Off => None,
        Switch::On(s) => Some(StateConfig {
            path: PathBuf::from(
                s.path
                    .unwrap_or_else(|| "/var/lib/shardgate/state.json".to_string()),
            ),
            interval: c.positive_ms("state.interval_ms", s.interval_ms, 1000),
        }),
    }
}
