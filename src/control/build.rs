//! The parts of the shared state as the configuration builds them, once
//! at start: each shard's peer, the router with the limits of the
//! `limits` section and of every plan, the domain map, the region
//! directory, and the embedder's hooks as the router calls them.

use super::build_peer;
use crate::cluster::Shared;
use crate::config::{Config, HashKind, LoadKind};
use crate::hooks::GatewayHooks;
use crate::limits::{Ledger, Limits, RateRule};
use crate::routing::{
    AllowHook, DomainMap, Fallback, HashStrategy, Load, LoadHook, RegionDirectory, Router,
    RouterOptions, ShardId,
};
use compact_str::CompactString;
use std::sync::Arc;

struct HookAllow(Arc<dyn GatewayHooks>);

impl AllowHook for HookAllow {
    fn allow(&self, tenant: &str) -> bool {
        self.0.allow(tenant)
    }
}

struct HookLoad(Arc<dyn GatewayHooks>);

impl LoadHook for HookLoad {
    fn load(&self, shard: &ShardId) -> f64 {
        self.0.load(shard)
    }
}

/// How to reach each configured shard.
pub(super) fn shard_peers(config: &Config) -> Result<super::Peers, String> {
    let mut peers = super::Peers::default();
    for shard in &config.shards {
        peers.insert(shard.id.clone(), Arc::new(build_peer(config, shard)?));
    }
    Ok(peers)
}

/// What the router weighs shards by: the embedder's hook if it gives
/// one, else `routing.load`.
pub(super) fn load_signal(config: &Config, hooks: &Arc<dyn GatewayHooks>) -> Load {
    if hooks.provides_load() {
        Load::Hook(Arc::new(HookLoad(Arc::clone(hooks))))
    } else {
        match config.routing.load {
            LoadKind::None => Load::None,
            LoadKind::ActiveConnections => Load::ActiveConnections,
        }
    }
}

/// The router over the configured shards, with the limits of the
/// `limits` section and of every plan (counted in the cluster's ledger
/// in cluster mode).
pub(super) fn router(
    config: &Config,
    hooks: &Arc<dyn GatewayHooks>,
    load: Load,
    cluster: Option<&Arc<Shared>>,
) -> Router {
    // Every plan's limits over one route list (a route index means the
    // same route whichever plan a tenant is on).
    let union = config.route_prefixes();
    let limits_of = |cap, rate, routes: &[(String, RateRule)], per_client| {
        let limits = Limits::over_union(cap, rate, routes, &union).with_per_client(per_client);
        match cluster {
            Some(shared) => limits.with_shared(Arc::clone(shared) as Arc<dyn Ledger>),
            None => limits,
        }
    };
    let l = &config.limits;
    let limits = limits_of(l.connection_cap, l.rate, &l.routes, l.per_client);
    let plans = (config.plans.plans.iter())
        .map(|p| {
            let limits = limits_of(p.connection_cap, p.rate, &p.routes, p.per_client);
            (CompactString::from(p.name.as_str()), limits)
        })
        .collect();
    Router::new(RouterOptions {
        shards: config.shards.clone(),
        hash: match config.routing.hash {
            HashKind::Jump => HashStrategy::Jump,
            HashKind::Rendezvous => HashStrategy::Rendezvous,
            HashKind::Hrw => HashStrategy::Hrw,
        },
        balance: config.routing.balance,
        limits,
        plans,
        plan_tenants: config.plans.tenants.clone(),
        default_plan: config.plans.default_plan,
        deny: config.limits.deny.clone(),
        allow: Some(Arc::new(HookAllow(Arc::clone(hooks)))),
        load,
        max_tracked_tenants: config.limits.max_tracked_tenants,
        max_tracked_clients: config.limits.max_tracked_clients,
        ..Default::default()
    })
}

/// The domain map of the `domains` section, with its fallback suffix.
pub(super) fn domain_map(config: &Config) -> Result<DomainMap, String> {
    let fallback = config
        .domains
        .fallback_suffix
        .as_deref()
        .map_or(Fallback::None, Fallback::suffix);
    DomainMap::from_entries(config.domains.map.iter().cloned(), fallback).map_err(|e| e.to_string())
}

/// The region directory, with a `regions` section.
pub(super) fn region_directory(
    config: &Config,
    cluster: Option<&Arc<Shared>>,
) -> Result<Option<RegionDirectory>, String> {
    let Some(list) = &config.regions else {
        return Ok(None);
    };
    // In cluster mode a new assignment takes the one another
    // node made first, if this node has read it.
    let hook = cluster.map(|shared| {
        Arc::new(crate::cluster::SharedRegions(Arc::clone(shared)))
            as Arc<dyn crate::routing::region::AssignHook>
    });
    let clock: Arc<dyn crate::routing::Clock> = Arc::new(crate::routing::MonotonicClock::new());
    let directory = RegionDirectory::with_options(list.clone(), hook, clock)
        .map_err(|e| e.to_string())?
        .bounded(config.limits.max_tracked_tenants);
    Ok(Some(directory))
}
