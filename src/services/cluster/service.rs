//! The cluster service: the only code that talks to Redis. Every
//! `sync_interval` it settles the tenants that spent (their leases topped
//! up, their credit charged: `settle/`) and publishes this node's live
//! admissions per capped tenant while reading the others'
//! (`admissions.rs`); every 200 ms it exchanges runtime state
//! (`runtime_state.rs`, `regions.rs` for the region assignments). The
//! heartbeat (`cluster/heartbeat.rs`) runs beside it on its own thread.
//! Requests never wait on it: while Redis is down they run on what the node
//! last knew (`outage.rs`, DESIGN §4). This file holds the service, its
//! loop and the state the steps share.

use super::runtime_state::STATE_PUT_LUA;
use super::settle::SETTLE_LUA;
use crate::cluster::heartbeat::Heartbeat;
use crate::cluster::link::Link;
use crate::cluster::Shared;
use crate::control::Control;
use compact_str::CompactString;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use redis::Script;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const STATE_POLL: Duration = Duration::from_millis(200);

pub struct ClusterService {
    control: Arc<Control>,
}

impl ClusterService {
    pub fn new(control: Arc<Control>) -> Self {
        ClusterService { control }
    }
}

#[async_trait::async_trait]
impl BackgroundService for ClusterService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(shared) = self.control.cluster.clone() else {
            return;
        };
        let mut sync = Syncer::new(Arc::clone(&self.control), shared);
        let me = sync.shared().node_id().to_string();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let heartbeat = Heartbeat::new(
            Arc::clone(sync.shared()),
            sync.key("nodes"),
            sync.caps_key(&me),
        )
        .start(Arc::clone(&stop));
        if let Err(e) = &heartbeat {
            log::error!(
                "cluster: the heartbeat thread did not start: {e}; this node is not seen alive"
            );
        }
        let mut settle = tokio::time::interval(sync.shared().config.sync_interval);
        let mut state = tokio::time::interval(STATE_POLL);
        for tick in [&mut settle, &mut state] {
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        loop {
            tokio::select! {
                _ = shutdown.changed() => {
                    // The last beat lands before the node leaves the set.
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    if let Ok(handle) = heartbeat {
                        let joined = tokio::task::spawn_blocking(move || handle.join());
                        let _ = tokio::time::timeout(Duration::from_secs(2), joined).await;
                    }
                    sync.leave().await;
                    return;
                }
                _ = settle.tick() => sync.settle().await,
                _ = state.tick() => sync.exchange_state().await,
            }
        }
    }
}

pub(super) struct Syncer {
    pub(super) control: Arc<Control>,
    pub(super) link: Link,
    /// Tenants this node holds state for, with their last request.
    pub(super) tracked: HashMap<CompactString, Instant>,
    /// This node's admissions per capped tenant as last written.
    pub(super) caps_written: HashMap<CompactString, u64>,
    /// Version of the shared state last applied, as read (`None`: load it
    /// all).
    pub(super) state_version: Option<Vec<u8>>,
    pub(super) regions: super::regions::RegionSync,
    /// `Shared::reconnects` as last seen.
    reconnects: u64,
    pub(super) last_settle: Instant,
    pub(super) one_offs: super::oneoff::OneOffs,
    pub(super) settle_script: Script,
    pub(super) state_script: Script,
}

impl Syncer {
    fn new(control: Arc<Control>, shared: Arc<Shared>) -> Self {
        Syncer {
            control,
            link: Link::new(shared, false),
            reconnects: 0,
            tracked: HashMap::new(),
            caps_written: HashMap::new(),
            state_version: None,
            regions: super::regions::RegionSync::default(),
            last_settle: Instant::now(),
            one_offs: super::oneoff::OneOffs::default(),
            settle_script: Script::new(SETTLE_LUA),
            state_script: Script::new(STATE_PUT_LUA),
        }
    }

    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.link.shared
    }

    pub(super) fn key(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.shared().config.key_prefix)
    }

    pub(super) fn tenant_key(&self, tenant: &str) -> String {
        self.key(&format!("t:{{{tenant}}}"))
    }

    pub(super) fn caps_key(&self, node: &str) -> String {
        self.key(&format!("caps:{{{node}}}"))
    }

    /// Forgets what this node believed Redis holds once Redis was lost (it
    /// may come back empty): every count is written again, and the shared
    /// state read again.
    pub(super) fn after_loss(&mut self) {
        let reconnects = self.link.shared.reconnects();
        let back = std::mem::replace(&mut self.reconnects, reconnects) != reconnects;
        if self.link.take_lost() || back {
            self.state_version = None;
            self.caps_written.clear();
        }
        if self.shared().take_caps_lost() {
            self.caps_written.clear();
        }
    }

    pub(super) async fn query<T: redis::FromRedisValue>(
        &mut self,
        what: &str,
        cmd: &redis::Cmd,
    ) -> Option<T> {
        self.link.query(what, cmd).await
    }

    /// Shutdown: this node leaves at once instead of after its TTL.
    async fn leave(&mut self) {
        if !self.shared().redis_up() {
            return;
        }
        let me = self.shared().node_id().to_string();
        let zrem = redis::cmd("ZREM")
            .arg(self.key("nodes"))
            .arg(&me)
            .to_owned();
        let _ = self.query::<i64>("leave", &zrem).await;
        let del = redis::cmd("DEL").arg(self.caps_key(&me)).to_owned();
        let _ = self.query::<i64>("leave", &del).await;
        self.leave_regions().await;
    }
}
