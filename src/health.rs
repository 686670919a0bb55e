//! Active health checks, in three pieces: a [`Probe`] (can we reach the
//! shard?), a [`RiseFall`] counter (`fall` failures in a row → unhealthy,
//! `rise` successes → healthy) and the [`HealthChecker`] that runs a round
//! over the current shards every `health.interval_ms`.
//!
//! Health is a measurement: probes override a failure hook's or an admin's
//! mark-unhealthy once `rise` probes pass. Draining is the operator's
//! decision, and probes never touch it.

use crate::config::HealthConfig;
use crate::control::Control;
use crate::routing::ShardId;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// One reachability check.
#[async_trait::async_trait]
pub trait Probe: Send + Sync {
    async fn probe(&self, addr: SocketAddr) -> bool;
}

/// A TCP connect within a timeout.
pub struct TcpProbe {
    pub timeout: Duration,
}

#[async_trait::async_trait]
impl Probe for TcpProbe {
    async fn probe(&self, addr: SocketAddr) -> bool {
        crate::proxy::pipeline::watch::probe(addr, self.timeout).await
    }
}

/// Consecutive results → health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RiseFall {
    pub healthy: bool,
    /// Consecutive results contradicting `healthy`.
    streak: u32,
}

impl RiseFall {
    pub fn new(healthy: bool) -> Self {
        RiseFall { healthy, streak: 0 }
    }

    /// Someone else set the health (failure hook, admin): start counting
    /// from that state.
    pub fn sync(&mut self, healthy: bool) {
        if healthy != self.healthy {
            *self = RiseFall::new(healthy);
        }
    }

    /// Records a probe; returns the new health if it changed.
    pub fn record(&mut self, ok: bool, rise: u32, fall: u32) -> Option<bool> {
        if ok == self.healthy {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        let needed = if ok { rise } else { fall };
        if self.streak >= needed {
            *self = RiseFall::new(ok);
            Some(ok)
        } else {
            None
        }
    }
}

/// The scheduler: probes every registered shard each interval.
pub struct HealthChecker {
    control: Arc<Control>,
    probe: Box<dyn Probe>,
    config: HealthConfig,
}

impl HealthChecker {
    pub fn new(control: Arc<Control>) -> Self {
        let config = control.config.health.clone();
        HealthChecker {
            probe: Box::new(TcpProbe {
                timeout: config.timeout,
            }),
            control,
            config,
        }
    }

    /// One round over the shards registered now; `counters` carries the
    /// streaks between rounds (removed shards are forgotten).
    pub async fn round(&self, counters: &mut HashMap<ShardId, RiseFall>) {
        let set = self.control.router.shard_set();
        let targets: Vec<(ShardId, bool, SocketAddr)> = set
            .all
            .iter()
            .filter_map(|e| {
                let peer = self.control.peer(e.id())?;
                Some((e.id().clone(), e.status.healthy, peer.addr))
            })
            .collect();
        counters.retain(|id, _| targets.iter().any(|(t, _, _)| t == id));
        let results = futures_util::future::join_all(
            targets.iter().map(|(_, _, addr)| self.probe.probe(*addr)),
        )
        .await;
        for ((id, healthy_now, _), ok) in targets.into_iter().zip(results) {
            let counter = counters
                .entry(id.clone())
                .or_insert(RiseFall::new(healthy_now));
            counter.sync(healthy_now);
            if let Some(healthy) = counter.record(ok, self.config.rise, self.config.fall) {
                log::info!(
                    "health: shard {id} is now {}",
                    if healthy { "healthy" } else { "unhealthy" }
                );
                self.control.router.set_probed_health(id.as_str(), healthy);
            }
        }
    }
}

#[async_trait::async_trait]
impl BackgroundService for HealthChecker {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut counters = HashMap::new();
        let mut tick = tokio::time::interval(self.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => self.round(&mut counters).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fall_and_rise_need_consecutive_results() {
        let mut c = RiseFall::new(true);
        assert_eq!(c.record(false, 2, 3), None);
        assert_eq!(c.record(false, 2, 3), None);
        assert_eq!(
            c.record(true, 2, 3),
            None,
            "a success resets the fall streak"
        );
        assert_eq!(c.record(false, 2, 3), None);
        assert_eq!(c.record(false, 2, 3), None);
        assert_eq!(c.record(false, 2, 3), Some(false));
        assert_eq!(c.record(true, 2, 3), None);
        assert_eq!(c.record(true, 2, 3), Some(true));
    }

    #[test]
    fn an_external_mark_restarts_the_count() {
        let mut c = RiseFall::new(true);
        c.sync(false); // the failure hook marked it down
        assert_eq!(c.record(true, 2, 3), None);
        assert_eq!(c.record(true, 2, 3), Some(true));
    }
}
