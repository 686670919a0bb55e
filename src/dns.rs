//! Shard host names to addresses: the resolver (the system's, or a
//! test's), a lookup with a deadline, and the address a shard's URL names.
//! `Control` asks it for a shard added at runtime; the refresh that
//! follows a name as it moves is `services::dns`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// A lookup that takes longer than this is a failed one.
pub(crate) const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The host name of a shard's URL and its port; `None` for an IP address.
pub fn host_name(url: &str) -> Option<(String, u16)> {
    let (_, host, port) = crate::config::parse_shard_url(url).ok()?;
    match host.parse::<IpAddr>() {
        Ok(_) => None,
        Err(_) => Some((host, port)),
    }
}

/// How a shard's host name resolves: its addresses, or why not.
pub trait Resolve: Send + Sync {
    fn resolve(
        &self,
        host: &str,
        port: u16,
    ) -> impl std::future::Future<Output = Result<Vec<SocketAddr>, String>> + Send;
}

/// The system's resolver (`getaddrinfo`, on a blocking thread).
pub struct SystemResolver;

impl Resolve for SystemResolver {
    async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        match tokio::net::lookup_host((host.to_string(), port)).await {
            Ok(addrs) => Ok(addrs.collect()),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// `resolver`'s answer for `host`, if it has an address and comes within
/// `within`: a resolver that never answers fails the lookup, it does not
/// hold what waits on it.
pub(crate) async fn lookup(
    resolver: &impl Resolve,
    host: &str,
    port: u16,
    within: Duration,
) -> Result<Vec<SocketAddr>, String> {
    match tokio::time::timeout(within, resolver.resolve(host, port)).await {
        Ok(Ok(addrs)) if addrs.is_empty() => Err("no address".to_string()),
        Ok(answer) => answer,
        Err(_) => Err(format!("no answer within {within:?}")),
    }
}

/// The address a shard's URL names: its IP address, or its host name
/// resolved by `resolver` (within the lookup's deadline, without blocking
/// a thread): what a shard added at runtime is reached at.
pub async fn shard_addr(shard: &crate::routing::Shard) -> Result<SocketAddr, String> {
    shard_addr_within(&SystemResolver, shard, LOOKUP_TIMEOUT).await
}

async fn shard_addr_within(
    resolver: &impl Resolve,
    shard: &crate::routing::Shard,
    within: Duration,
) -> Result<SocketAddr, String> {
    let (_, host, port) = crate::config::parse_shard_url(&shard.url)?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    match lookup(resolver, &host, port, within).await {
        Ok(addrs) => Ok(addrs[0]),
        Err(e) => Err(format!(
            "shard `{}`: cannot resolve `{host}`: {e}",
            shard.id
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A resolver that answers `localhost` after `delay`, or never.
    pub(crate) struct Slow(pub Option<Duration>);

    impl Resolve for Slow {
        async fn resolve(&self, _host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
            match self.0 {
                Some(delay) => tokio::time::sleep(delay).await,
                None => std::future::pending().await,
            }
            Ok(vec![SocketAddr::from(([127, 0, 0, 1], port))])
        }
    }

    #[tokio::test]
    async fn a_lookup_that_never_answers_fails_at_its_deadline() {
        let shard = crate::routing::Shard {
            id: crate::routing::ShardId::new("named"),
            url: "http://hangs.example:80".to_string(),
            weight: 1.0,
            region: None,
            tenants: None,
            protocol: Default::default(),
            proxy_protocol: false,
        };
        let started = std::time::Instant::now();
        let within = Duration::from_millis(200);
        let answer = shard_addr_within(&Slow(None), &shard, within).await;
        let error = answer.expect_err("no answer");
        assert!(
            error.contains("hangs.example") && error.contains("no answer"),
            "{error}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        // An IP address is no lookup.
        let literal = crate::routing::Shard {
            url: "http://10.0.0.1:80".to_string(),
            ..shard
        };
        let addr = shard_addr_within(&Slow(None), &literal, within).await;
        assert_eq!(addr, Ok("10.0.0.1:80".parse().unwrap()));
    }
}
