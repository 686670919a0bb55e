//! The heartbeat: every 250 ms this node registers in the nodes set and
//! reads who is alive, on its own thread (its own runtime: Pingora runs a
//! background service on one thread, which the sync's passes over every
//! tenant may hold) and its own Redis connection, so a slow settle or
//! state pass never gets it declared dead. Liveness is
//! judged on Redis' clock (`TIME`), never on a node's: a node whose clock
//! is off still sees the others, and is seen, as alive.

use super::link::Link;
use super::shared::{NodeSeen, Shared};
use super::NODE_TTL_MS;
use redis::Script;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const HEARTBEAT: Duration = Duration::from_millis(250);

/// Stamps this node (ARGV[1]) with Redis' time in the nodes set
/// (KEYS[1]), drops nodes silent for a minute and stamps over a minute in
/// the future (Redis' clock stepped back, as after a failover to a host
/// behind: a dead node's stamp would stay ahead for as long), and returns
/// Redis' time and every node with its stamp.
const HEARTBEAT_LUA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 60000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '(' .. (now + 60000), '+inf')
return {tostring(now), redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')}
";

/// Whether a node stamped at `stamp` is alive at `now` (Redis' clock): a
/// stamp within the node TTL either way. One far ahead is no proof of
/// life: Redis' clock went back, and a live node stamps again within a
/// beat.
fn stamped_alive(now: u64, stamp: u64) -> bool {
    now.abs_diff(stamp) <= NODE_TTL_MS
}

pub(crate) struct Heartbeat {
    link: Link,
    script: Script,
    nodes_key: String,
    caps_key: String,
}

impl Heartbeat {
    pub fn new(shared: Arc<Shared>, nodes_key: String, caps_key: String) -> Self {
        Heartbeat {
            link: Link::new(shared, true),
            script: Script::new(HEARTBEAT_LUA),
            nodes_key,
            caps_key,
        }
    }

    /// Beats on a thread of its own until `stop` is set; the handle ends
    /// once the last beat is done.
    pub fn start(self, stop: Arc<AtomicBool>) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("shardgate-heartbeat".to_string())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match runtime {
                    Ok(runtime) => runtime.block_on(self.run(stop)),
                    Err(e) => log::error!("cluster: no runtime for the heartbeat: {e}"),
                }
            })
    }

    async fn run(mut self, stop: Arc<AtomicBool>) {
        let mut tick = tokio::time::interval(HEARTBEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if stop.load(Ordering::Relaxed) {
                return;
            }
            self.beat().await;
        }
    }

    /// Registers this node and reads which nodes are alive.
    async fn beat(&mut self) {
        let shared = Arc::clone(&self.link.shared);
        let was_up = shared.redis_up();
        let mut invocation = self.script.key(&self.nodes_key);
        invocation.arg(shared.node_id());
        let Some((now, seen)) = self
            .link
            .invoke::<(u64, Vec<(Vec<u8>, f64)>)>("heartbeat", &invocation)
            .await
        else {
            return;
        };
        let touch = redis::cmd("PEXPIRE")
            .arg(&self.caps_key)
            .arg(NODE_TTL_MS)
            .to_owned();
        if self.link.query::<i64>("heartbeat", &touch).await == Some(0) {
            shared.lose_caps();
        }
        // A member no node wrote (not text) is skipped, not fatal.
        let nodes: Vec<NodeSeen> = seen
            .into_iter()
            .filter_map(|(id, score)| {
                Some(NodeSeen {
                    id: String::from_utf8(id).ok()?,
                    last_seen_ms: score as u64,
                })
            })
            .collect();
        let alive: Vec<String> = nodes
            .iter()
            .filter(|n| stamped_alive(now, n.last_seen_ms))
            .map(|n| n.id.clone())
            .collect();
        let count = alive.len();
        shared.set_nodes(nodes, alive, now);
        if !was_up {
            log::info!("cluster: Redis reachable; {count} node(s) alive");
            shared.set_redis_up(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{stamped_alive, NODE_TTL_MS};

    #[test]
    fn a_stamp_far_ahead_of_redis_clock_is_not_alive() {
        let now = 1_000_000_000;
        assert!(stamped_alive(now, now));
        assert!(stamped_alive(now, now - NODE_TTL_MS));
        assert!(!stamped_alive(now, now - NODE_TTL_MS - 1));
        assert!(stamped_alive(now, now + NODE_TTL_MS));
        assert!(!stamped_alive(now, now + 3_600_000));
    }
}
