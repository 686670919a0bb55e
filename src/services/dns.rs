//! Shards named by host name, resolved again every
//! `upstream.dns_refresh_ms`: a shard behind a Kubernetes Service or a DNS
//! failover follows its name. A name that stops resolving keeps its last
//! addresses (logged, and counted in `shardgate_dns_failures_total`); one
//! that moves takes new requests to its new address, and the fast
//! transport's pools close their idle connections to the old one at their
//! next sweep.

use crate::control::Control;
use crate::dns::{host_name, lookup, Resolve, SystemResolver, LOOKUP_TIMEOUT};
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::sync::Arc;

/// Lookups a refresh runs at once: many names resolve in about one
/// lookup's time, and a slow resolver is not flooded.
const REFRESH_PARALLEL: usize = 16;

/// The background service that resolves shard names again.
pub struct ShardResolver<R = SystemResolver> {
    control: Arc<Control>,
    resolver: R,
}

impl ShardResolver {
    pub fn new(control: Arc<Control>) -> Self {
        ShardResolver {
            control,
            resolver: SystemResolver,
        }
    }
}

impl<R: Resolve> ShardResolver<R> {
    /// With another resolver (tests).
    pub fn with_resolver(control: Arc<Control>, resolver: R) -> Self {
        ShardResolver { control, resolver }
    }

    /// One round: every shard named by host name, resolved again, up to
    /// [`REFRESH_PARALLEL`] at once (one slow name delays no other).
    pub async fn refresh(&self) {
        use futures_util::StreamExt;
        let shards: Vec<_> = self
            .control
            .router
            .shard_set()
            .all
            .iter()
            .map(|e| Arc::clone(&e.shard))
            .collect();
        futures_util::stream::iter(shards)
            .for_each_concurrent(REFRESH_PARALLEL, |shard| self.refresh_one(shard))
            .await;
    }

    async fn refresh_one(&self, shard: Arc<crate::routing::Shard>) {
        let Some((host, port)) = host_name(&shard.url) else {
            return;
        };
        match lookup(&self.resolver, &host, port, LOOKUP_TIMEOUT).await {
            Ok(addrs) => {
                if let Some(addr) = self.control.repoint(&shard, &addrs) {
                    log::info!("shard `{}`: `{host}` now resolves to {addr}", shard.id);
                }
            }
            Err(e) => {
                log::warn!(
                    "shard `{}`: `{host}` did not resolve ({e}); its last address stays",
                    shard.id
                );
                self.control.metrics.dns_failure(shard.id.as_str());
            }
        }
    }
}

#[async_trait]
impl<R: Resolve + 'static> BackgroundService for ShardResolver<R> {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let every = self.control.config.upstream.dns_refresh;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => self.refresh().await,
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::dns::tests::Slow;
    use crate::hooks::DefaultHooks;
    use parking_lot::Mutex;
    use std::net::SocketAddr;
    use std::time::Duration;

    /// A resolver whose answers the test sets.
    struct Scripted(Mutex<Result<Vec<SocketAddr>, String>>);

    impl Resolve for &Scripted {
        async fn resolve(&self, _host: &str, _port: u16) -> Result<Vec<SocketAddr>, String> {
            self.0.lock().clone()
        }
    }

    #[tokio::test]
    async fn a_refresh_resolves_its_names_side_by_side() {
        let shards: String = (0..20)
            .map(|i| {
                format!(
                    "  - {{ id: s{i}, url: \"http://localhost:{}\" }}\n",
                    4000 + i
                )
            })
            .collect();
        let yaml = format!(
            "listen: [{{ addr: \"127.0.0.1:1\" }}]\nstate: false\nshards:\n{shards}domains: {{ fallback_suffix: .localhost }}\n"
        );
        let config = Config::parse(&yaml, Some("test.yaml")).expect("config");
        let control = Arc::new(Control::new(config, Arc::new(DefaultHooks)).expect("control"));
        let resolver =
            ShardResolver::with_resolver(control, Slow(Some(Duration::from_millis(300))));
        let started = std::time::Instant::now();
        resolver.refresh().await;
        // One after the other: 6 s.
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "{took:?}");
    }

    fn control() -> Arc<Control> {
        let yaml = r#"
listen: [{ addr: "127.0.0.1:1" }]
state: false
shards:
  - { id: named, url: "http://localhost:3001" }
  - { id: literal, url: "http://127.0.0.1:3002" }
domains: { fallback_suffix: .localhost }
"#;
        let config = Config::parse(yaml, Some("test.yaml")).expect("config");
        Arc::new(Control::new(config, Arc::new(DefaultHooks)).expect("control"))
    }

    #[tokio::test]
    async fn a_name_follows_its_addresses_and_keeps_the_last_when_it_fails() {
        let control = control();
        let named = crate::routing::ShardId::new("named");
        let before = control.peer(&named).unwrap().addr;
        let scripted = Scripted(Mutex::new(Ok(vec![before])));
        let resolver = ShardResolver::with_resolver(Arc::clone(&control), &scripted);
        // Still among the answers: nothing moves.
        *scripted.0.lock() = Ok(vec!["10.0.0.9:3001".parse().unwrap(), before]);
        resolver.refresh().await;
        assert_eq!(control.peer(&named).unwrap().addr, before);
        // Gone from them: the first answer.
        *scripted.0.lock() = Ok(vec!["10.0.0.7:3001".parse().unwrap()]);
        resolver.refresh().await;
        let moved = control.peer(&named).unwrap();
        assert_eq!(moved.addr, "10.0.0.7:3001".parse().unwrap());
        assert_eq!(moved.key.addr, moved.addr);
        assert!(control.peer_keys().contains(&moved.key));
        // A failure keeps it, and counts once per round for that shard only.
        *scripted.0.lock() = Err("NXDOMAIN".to_string());
        resolver.refresh().await;
        resolver.refresh().await;
        assert_eq!(control.peer(&named).unwrap().addr, moved.addr);
        let failures = control.metrics.dns_failures();
        assert_eq!(failures.get("named"), Some(&2));
        assert_eq!(
            failures.get("literal"),
            None,
            "an IP address is never resolved"
        );
    }
}
