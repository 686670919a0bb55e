//! The region directory: which region a tenant lives in. Assignments are
//! sticky; the default pick is the reference's weighted rendezvous over the
//! region ids; an assign hook and explicit overrides take precedence, and a
//! tenant whose region was removed is re-assigned lazily on its next lookup.

use super::clock::{Clock, MonotonicClock};
use super::hash::{rendezvous_pick, Contestant, RoutingKey};
use arc_swap::ArcSwap;
use compact_str::CompactString;
use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;

fn default_weight() -> f64 {
    1.0
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Region {
    pub id: String,
    #[serde(default = "default_weight")]
    pub weight: f64,
}

impl Region {
    pub fn new(id: impl Into<String>) -> Self {
        Region {
            id: id.into(),
            weight: 1.0,
        }
    }

    pub fn with_weight(mut self, weight: f64) -> Self {
        self.weight = weight;
        self
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegionError {
    /// A directory needs at least one region.
    NoRegions,
    UnknownRegion(String),
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionError::NoRegions => f.write_str("a region directory needs at least one region"),
            RegionError::UnknownRegion(r) => write!(f, "unknown region `{r}`"),
        }
    }
}

impl std::error::Error for RegionError {}

/// Chooses a region for a tenant that has none; `None` (or an unknown id)
/// falls back to the default pick.
pub trait AssignHook: Send + Sync {
    fn assign(&self, tenant: &str) -> Option<String>;

    /// Whether a forgotten assignment equal to the default pick may be
    /// left to the hook to answer again (it answers a tenant the same way
    /// each time, or the default pick). Only then does the directory sweep
    /// its assignments: an arbitrary hook may pick anew.
    fn rederivable(&self) -> bool {
        false
    }
}

impl<F: Fn(&str) -> Option<String> + Send + Sync> AssignHook for F {
    fn assign(&self, tenant: &str) -> Option<String> {
        self(tenant)
    }
}

#[derive(Clone, Debug)]
struct Assignment {
    region: Arc<str>,
    is_override: bool,
}

const ASSIGNMENT_SHARDS: usize = 64;

/// Past this many assignments a table shard forgets those it can re-derive
/// (no override, equal to the default pick over the current regions), so
/// invented tenant ids cannot grow the directory without bound.
/// (1 024: the sweep walks a shard once per as many new tenants, and the
/// memory it lets come and go stays small; `soak.sh` saw RSS swing by the
/// directory's 262 144 entries at 4 096.)
pub const ASSIGNMENT_SHARD_LIMIT: usize = 1024;

/// Region ids with their weights, in the order they were registered.
pub type RegionList = Vec<(Arc<str>, f64)>;

type AssignmentMap = hashbrown::HashMap<CompactString, Assignment, foldhash::fast::RandomState>;

/// One lock's worth of assignments, and the size that triggers its next sweep.
#[derive(Default)]
struct AssignmentShard {
    map: AssignmentMap,
    high_water: usize,
}

impl std::ops::Deref for AssignmentShard {
    type Target = AssignmentMap;
    fn deref(&self) -> &AssignmentMap {
        &self.map
    }
}

impl std::ops::DerefMut for AssignmentShard {
    fn deref_mut(&mut self) -> &mut AssignmentMap {
        &mut self.map
    }
}

/// One stored assignment, as in a snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AssignmentSnapshot {
    #[serde(rename = "override")]
    pub is_override: bool,
    pub region: String,
    pub tenant: String,
}

/// The directory's state, shaped as the reference's `snapshot()`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegionSnapshot {
    pub assignments: Vec<AssignmentSnapshot>,
    pub at: f64,
    pub regions: Vec<Region>,
    pub version: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RegionMetrics {
    pub assignments: usize,
    pub by_region: BTreeMap<String, usize>,
    pub overrides: usize,
}

pub struct RegionDirectory {
    regions: ArcSwap<RegionList>,
    write: Mutex<()>,
    assignments: Box<[CachePadded<RwLock<AssignmentShard>>]>,
    hasher: foldhash::fast::RandomState,
    assign: Option<Arc<dyn AssignHook>>,
    clock: Arc<dyn Clock>,
    /// A table shard's size that triggers its first sweep.
    shard_limit: usize,
}

impl RegionDirectory {
    pub fn new(regions: Vec<Region>) -> Result<Self, RegionError> {
        Self::with_options(regions, None, Arc::new(MonotonicClock::new()))
    }

    pub fn with_options(
        regions: Vec<Region>,
        assign: Option<Arc<dyn AssignHook>>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, RegionError> {
        if regions.is_empty() {
            return Err(RegionError::NoRegions);
        }
        let mut list: Vec<(Arc<str>, f64)> = Vec::new();
        for r in regions {
            if !list.iter().any(|(id, _)| **id == *r.id) {
                list.push((Arc::from(r.id.as_str()), r.weight));
            }
        }
        Ok(RegionDirectory {
            regions: ArcSwap::from_pointee(list),
            write: Mutex::new(()),
            assignments: (0..ASSIGNMENT_SHARDS)
                .map(|_| {
                    CachePadded::new(RwLock::new(AssignmentShard {
                        map: AssignmentMap::default(),
                        high_water: ASSIGNMENT_SHARD_LIMIT,
                    }))
                })
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
            assign,
            clock,
            shard_limit: ASSIGNMENT_SHARD_LIMIT,
        })
    }

    /// Sweeps sooner when the tenants tracked are fewer: a shard's first
    /// sweep comes at `max_tenants / 64` entries (16 at least), never later
    /// than [`ASSIGNMENT_SHARD_LIMIT`].
    pub fn bounded(mut self, max_tenants: usize) -> Self {
        self.shard_limit = (max_tenants / ASSIGNMENT_SHARDS).clamp(16, ASSIGNMENT_SHARD_LIMIT);
        for shard in self.assignments.iter() {
            shard.write().high_water = self.shard_limit;
        }
        self
    }

    fn shard(&self, tenant: &str) -> &RwLock<AssignmentShard> {
        let h = self.hasher.hash_one(tenant);
        &self.assignments[(h >> 58) as usize % ASSIGNMENT_SHARDS]
    }

    fn registered<'a>(list: &'a [(Arc<str>, f64)], id: &str) -> Option<&'a Arc<str>> {
        list.iter().map(|(r, _)| r).find(|r| &***r == id)
    }

    /// The reference's default pick: weighted rendezvous over region ids.
    pub fn default_pick(list: &[(Arc<str>, f64)], tenant: &str) -> Arc<str> {
        let key = RoutingKey::new(tenant, None);
        let i = rendezvous_pick(
            &key,
            list.iter().map(|(id, w)| Contestant {
                id,
                effective_weight: (*w > 0.0 || w.is_nan()).then_some(*w),
            }),
        );
        Arc::clone(&list[i].0)
    }

    /// A new assignment: the hook's answer if it names a registered region,
    /// else the default pick.
    fn choose(&self, list: &[(Arc<str>, f64)], tenant: &str) -> Arc<str> {
        if let Some(hook) = &self.assign {
            if let Some(id) = hook.assign(tenant) {
                if let Some(r) = Self::registered(list, &id) {
                    return Arc::clone(r);
                }
            }
        }
        Self::default_pick(list, tenant)
    }

    /// Calls `f` with the tenant's region, assigning one if it has none or
    /// if its region was removed.
    pub fn with_region_for<R>(&self, tenant: &str, f: impl FnOnce(&str) -> R) -> R {
        let list = self.regions.load();
        let shard = self.shard(tenant);
        {
            let map = shard.read();
            if let Some(a) = map.get(tenant) {
                if Self::registered(&list, &a.region).is_some() {
                    return f(&a.region);
                }
            }
        }
        let region = self.choose(&list, tenant);
        let mut map = shard.write();
        if let Some(a) = map.get(tenant) {
            if Self::registered(&list, &a.region).is_some() {
                return f(&a.region);
            }
        }
        let sweeps = self.assign.as_ref().is_none_or(|hook| hook.rederivable());
        if map.len() >= map.high_water && sweeps {
            map.retain(|t, a| a.is_override || a.region != Self::default_pick(&list, t));
            map.high_water = self.shard_limit.max(map.len() * 2);
        }
        map.insert(
            CompactString::from(tenant),
            Assignment {
                region: Arc::clone(&region),
                is_override: false,
            },
        );
        f(&region)
    }

    /// The tenant's region (see [`RegionDirectory::with_region_for`]).
    pub fn region_for(&self, tenant: &str) -> String {
        self.with_region_for(tenant, str::to_string)
    }

    /// The region a lookup would answer, without assigning anything.
    pub fn peek_region_for(&self, tenant: &str) -> String {
        let list = self.regions.load();
        if let Some(a) = self.shard(tenant).read().get(tenant) {
            if Self::registered(&list, &a.region).is_some() {
                return a.region.to_string();
            }
        }
        self.choose(&list, tenant).to_string()
    }

    /// The tenant's current assignment, if it has one (assigns nothing).
    pub fn assigned_region(&self, tenant: &str) -> Option<String> {
        let list = self.regions.load();
        let map = self.shard(tenant).read();
        let a = map.get(tenant)?;
        Self::registered(&list, &a.region).map(|r| r.to_string())
    }

    /// Pins a tenant to a region (an override).
    pub fn assign(&self, tenant: &str, region: &str) -> Result<(), RegionError> {
        let list = self.regions.load();
        let Some(r) = Self::registered(&list, region) else {
            return Err(RegionError::UnknownRegion(region.to_string()));
        };
        self.shard(tenant).write().insert(
            CompactString::from(tenant),
            Assignment {
                region: Arc::clone(r),
                is_override: true,
            },
        );
        Ok(())
    }

    /// Takes another node's assignment for a tenant this directory has
    /// assigned too (cluster mode: the first assignment wins). An override
    /// is left alone. Returns whether the tenant's region changed.
    pub fn adopt(&self, tenant: &str, region: &str) -> bool {
        let list = self.regions.load();
        let Some(r) = Self::registered(&list, region) else {
            return false;
        };
        let mut map = self.shard(tenant).write();
        match map.get(tenant) {
            None => false,
            Some(a) if a.is_override || a.region == *r => false,
            Some(_) => {
                map.insert(
                    CompactString::from(tenant),
                    Assignment {
                        region: Arc::clone(r),
                        is_override: false,
                    },
                );
                true
            }
        }
    }

    /// Forgets the tenant's assignment; returns whether it had one.
    pub fn release(&self, tenant: &str) -> bool {
        self.shard(tenant).write().remove(tenant).is_some()
    }

    /// Appends a region; no change if the id exists.
    pub fn add_region(&self, region: Region) -> bool {
        let _w = self.write.lock();
        let list = self.regions.load();
        if Self::registered(&list, &region.id).is_some() {
            return false;
        }
        let mut next = Vec::clone(&list);
        next.push((Arc::from(region.id.as_str()), region.weight));
        self.regions.store(Arc::new(next));
        true
    }

    /// Removes a region; its tenants are re-assigned on their next lookup.
    /// The last region cannot be removed.
    pub fn remove_region(&self, id: &str) -> Result<bool, RegionError> {
        let _w = self.write.lock();
        let list = self.regions.load();
        if Self::registered(&list, id).is_none() {
            return Ok(false);
        }
        if list.len() == 1 {
            return Err(RegionError::NoRegions);
        }
        let next: Vec<_> = list.iter().filter(|(r, _)| &**r != id).cloned().collect();
        self.regions.store(Arc::new(next));
        Ok(true)
    }

    /// The registered regions as the default pick sees them.
    pub fn list(&self) -> Arc<RegionList> {
        self.regions.load_full()
    }

    pub fn regions(&self) -> Vec<Region> {
        self.regions
            .load()
            .iter()
            .map(|(id, w)| Region {
                id: id.to_string(),
                weight: *w,
            })
            .collect()
    }

    pub fn has_region(&self, id: &str) -> bool {
        Self::registered(&self.regions.load(), id).is_some()
    }

    /// Overrides only, sorted by tenant (what an operator pinned).
    pub fn overrides(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for shard in self.assignments.iter() {
            for (t, a) in shard.read().iter() {
                if a.is_override {
                    out.push((t.to_string(), a.region.to_string()));
                }
            }
        }
        out.sort();
        out
    }

    pub fn snapshot(&self) -> RegionSnapshot {
        let mut assignments = Vec::new();
        for shard in self.assignments.iter() {
            for (t, a) in shard.read().iter() {
                assignments.push(AssignmentSnapshot {
                    is_override: a.is_override,
                    region: a.region.to_string(),
                    tenant: t.to_string(),
                });
            }
        }
        assignments.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        RegionSnapshot {
            assignments,
            at: self.clock.now_ms(),
            regions: self.regions(),
            version: 1,
        }
    }

    /// Replaces every assignment with the snapshot's (the region list is
    /// not restored; assignments to unknown regions re-assign lazily).
    pub fn restore(&self, snapshot: &RegionSnapshot) {
        for shard in self.assignments.iter() {
            shard.write().clear();
        }
        for a in &snapshot.assignments {
            self.shard(&a.tenant).write().insert(
                CompactString::from(a.tenant.as_str()),
                Assignment {
                    region: Arc::from(a.region.as_str()),
                    is_override: a.is_override,
                },
            );
        }
    }

    pub fn metrics(&self) -> RegionMetrics {
        let mut m = RegionMetrics::default();
        for shard in self.assignments.iter() {
            for a in shard.read().values() {
                m.assignments += 1;
                *m.by_region.entry(a.region.to_string()).or_default() += 1;
                m.overrides += usize::from(a.is_override);
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> RegionDirectory {
        RegionDirectory::new(vec![Region::new("us-east"), Region::new("eu-west")]).unwrap()
    }

    #[test]
    fn needs_at_least_one_region() {
        assert_eq!(
            RegionDirectory::new(vec![]).err(),
            Some(RegionError::NoRegions)
        );
    }

    #[test]
    fn default_picks_match_the_reference() {
        let d = two();
        for t in ["acme", "sticky", "other", "t"] {
            assert_eq!(d.region_for(t), "eu-west", "{t}");
        }
        let expect = ["us", "eu", "us", "us", "us", "us", "us", "eu", "us", "eu"];
        for (i, e) in expect.iter().enumerate() {
            assert!(d.region_for(&format!("tenant-{i}")).starts_with(e));
        }
    }

    #[test]
    fn overrides_reject_unknown_regions_and_win() {
        let d = two();
        assert_eq!(
            d.assign("acme", "mars"),
            Err(RegionError::UnknownRegion("mars".into()))
        );
        d.assign("acme", "us-east").unwrap();
        assert_eq!(d.region_for("acme"), "us-east");
        assert_eq!(d.metrics().overrides, 1);
        assert!(d.release("acme"));
        assert_eq!(d.region_for("acme"), "eu-west");
        assert_eq!(d.metrics().overrides, 0);
    }

    #[test]
    fn removed_region_reassigns_lazily_and_loses_the_override_flag() {
        let d = two();
        d.assign("acme", "eu-west").unwrap();
        assert_eq!(d.remove_region("eu-west"), Ok(true));
        // Stale until looked up.
        assert_eq!(d.metrics().by_region.get("eu-west"), Some(&1));
        assert_eq!(d.region_for("acme"), "us-east");
        let m = d.metrics();
        assert_eq!(m.overrides, 0);
        assert_eq!(m.by_region.get("us-east"), Some(&1));
        assert_eq!(d.remove_region("us-east"), Err(RegionError::NoRegions));
    }

    #[test]
    fn assign_hook_wins_when_it_names_a_known_region() {
        let hook: Arc<dyn AssignHook> = Arc::new(|t: &str| {
            (t == "acme")
                .then(|| "us-east".to_string())
                .or_else(|| Some("nowhere".to_string()))
        });
        let d = RegionDirectory::with_options(
            vec![Region::new("us-east"), Region::new("eu-west")],
            Some(hook),
            Arc::new(MonotonicClock::new()),
        )
        .unwrap();
        assert_eq!(d.region_for("acme"), "us-east");
        assert_eq!(d.region_for("sticky"), "eu-west");
    }

    #[test]
    fn peek_assigns_nothing() {
        let d = two();
        assert_eq!(d.peek_region_for("acme"), "eu-west");
        assert_eq!(d.metrics().assignments, 0);
    }

    #[test]
    fn snapshot_round_trips_assignments() {
        let d = two();
        d.region_for("a");
        d.assign("b", "us-east").unwrap();
        let snap = d.snapshot();
        let e = two();
        e.restore(&snap);
        assert_eq!(e.metrics(), d.metrics());
        assert_eq!(e.snapshot().assignments, snap.assignments);
    }

    #[test]
    fn assignments_stay_bounded_under_invented_tenants() {
        let d = two();
        for i in 0..(ASSIGNMENT_SHARD_LIMIT * ASSIGNMENT_SHARDS * 2) {
            d.region_for(&format!("x{i}"));
        }
        assert!(d.metrics().assignments <= ASSIGNMENT_SHARD_LIMIT * ASSIGNMENT_SHARDS);
    }

    /// A hook that answers the same each time (cluster mode's) lets the
    /// directory sweep; any other keeps every assignment it made.
    #[test]
    fn only_a_rederivable_hook_lets_the_directory_sweep() {
        struct Pinned(bool);
        impl AssignHook for Pinned {
            fn assign(&self, tenant: &str) -> Option<String> {
                tenant.starts_with("pinned").then(|| "b".to_string())
            }
            fn rederivable(&self) -> bool {
                self.0
            }
        }
        let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
        let regions = vec![Region::new("a"), Region::new("b")];
        let limit = 16 * ASSIGNMENT_SHARDS;
        for rederivable in [true, false] {
            let hook: Arc<dyn AssignHook> = Arc::new(Pinned(rederivable));
            let d = RegionDirectory::with_options(regions.clone(), Some(hook), Arc::clone(&clock))
                .expect("regions")
                .bounded(limit);
            for i in 0..100 {
                assert_eq!(d.region_for(&format!("pinned{i}")), "b");
            }
            for i in 0..limit * 4 {
                d.region_for(&format!("x{i}"));
            }
            let kept = d.metrics().assignments;
            if rederivable {
                assert!(kept <= limit * 2, "swept: {kept}");
            } else {
                assert_eq!(kept, limit * 4 + 100, "nothing swept");
            }
            // The hook's picks stay either way (kept, or equal to the
            // default pick and answered again).
            for i in 0..100 {
                assert_eq!(d.region_for(&format!("pinned{i}")), "b");
            }
        }
    }
}
