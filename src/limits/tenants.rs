//! The tenant table: per-tenant live connections and token buckets, shared by
//! every worker thread. It is split into independently locked shards (no
//! global lock), each entry has its own small lock, and entries that carry no
//! information (idle, buckets full) are forgotten when a shard grows, so an
//! attacker inventing tenant ids cannot grow it without bound.

use super::bucket::TokenBucket;
use compact_str::CompactString;
use crossbeam_utils::CachePadded;
use hashbrown::HashTable;
use parking_lot::{Mutex, RwLock};
use smallvec::SmallVec;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const TABLE_SHARDS: usize = 64;

/// A table shard sweeps out forgettable entries before it grows past this
/// many entries (and then past twice what survived the sweep). With 64
/// shards the table holds at most `64 × 256` entries plus twice the number
/// of tenants that are active or have spent tokens not yet refilled.
pub const SWEEP_FLOOR: usize = 256;

/// The bound [`SWEEP_FLOOR`] gives when every tenant is forgettable.
pub const FORGETTABLE_BOUND: usize = TABLE_SHARDS * SWEEP_FLOOR;

/// The buckets of one tenant: its own, and one per limited route it used.
#[derive(Clone, Debug)]
pub struct TenantBuckets {
    pub tenant: TokenBucket,
    /// `(route index, bucket)`, created on the route's first use.
    pub routes: SmallVec<[(u16, TokenBucket); 2]>,
}

impl TenantBuckets {
    pub fn route_mut(&mut self, index: u16) -> Option<&mut TokenBucket> {
        self.routes
            .iter_mut()
            .find(|(i, _)| *i == index)
            .map(|(_, b)| b)
    }
}

/// One tenant's state.
#[derive(Debug)]
pub struct TenantEntry {
    id: CompactString,
    hash: u64,
    /// Live admissions. Incremented only under `buckets`' lock (so a cap
    /// check and its increment are one step); decremented lock-free by
    /// guards, which can only make a later check more permissive.
    pub(crate) active: AtomicU64,
    pub(crate) buckets: Mutex<TenantBuckets>,
}

impl TenantEntry {
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn active(&self) -> u64 {
        self.active.load(Ordering::Acquire)
    }

    /// Decrements `active`, never below zero.
    pub(crate) fn release(&self) {
        let _ = self
            .active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| a.checked_sub(1));
    }
}

struct TableShard {
    entries: HashTable<Arc<TenantEntry>>,
    high_water: usize,
}

/// Concurrent map tenant id → [`TenantEntry`].
pub struct TenantTable {
    shards: Box<[CachePadded<RwLock<TableShard>>]>,
    hasher: foldhash::fast::RandomState,
}

impl Default for TenantTable {
    fn default() -> Self {
        Self::new()
    }
}

impl TenantTable {
    pub fn new() -> Self {
        TenantTable {
            shards: (0..TABLE_SHARDS)
                .map(|_| {
                    CachePadded::new(RwLock::new(TableShard {
                        entries: HashTable::new(),
                        high_water: SWEEP_FLOOR,
                    }))
                })
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    #[inline]
    fn locate(&self, tenant: &str) -> (u64, &RwLock<TableShard>) {
        let hash = self.hasher.hash_one(tenant);
        // The low bits pick the bucket inside hashbrown; use the high ones.
        let shard = (hash >> 58) as usize % TABLE_SHARDS;
        (hash, &self.shards[shard])
    }

    /// Runs `f` on the tenant's entry if it exists.
    pub fn with_existing<R>(
        &self,
        tenant: &str,
        f: impl FnOnce(&Arc<TenantEntry>) -> R,
    ) -> Option<R> {
        let (hash, shard) = self.locate(tenant);
        let guard = shard.read();
        guard.entries.find(hash, |e| e.id.as_str() == tenant).map(f)
    }

    /// Runs `f` on the tenant's entry, creating it with `fresh` if missing.
    /// `f` runs while the table shard is locked, so an entry it makes
    /// active cannot be swept concurrently. Before the shard grows past its
    /// high-water mark it forgets every entry `forgettable` approves.
    pub fn with_entry<R>(
        &self,
        tenant: &str,
        fresh: impl FnOnce() -> TenantBuckets,
        forgettable: impl Fn(&TenantEntry) -> bool,
        f: impl FnOnce(&Arc<TenantEntry>) -> R,
    ) -> R {
        let (hash, shard) = self.locate(tenant);
        {
            let guard = shard.read();
            if let Some(e) = guard.entries.find(hash, |e| e.id.as_str() == tenant) {
                return f(e);
            }
        }
        let mut guard = shard.write();
        if let Some(e) = guard.entries.find(hash, |e| e.id.as_str() == tenant) {
            return f(e);
        }
        if guard.entries.len() >= guard.high_water {
            guard.entries.retain(|e| !forgettable(e));
            guard.entries.shrink_to(0, |e| e.hash);
            guard.high_water = SWEEP_FLOOR.max(guard.entries.len() * 2);
        }
        let entry = Arc::new(TenantEntry {
            id: CompactString::from(tenant),
            hash,
            active: AtomicU64::new(0),
            buckets: Mutex::new(fresh()),
        });
        let slot = guard.entries.insert_unique(hash, entry, |e| e.hash);
        f(slot.get())
    }

    /// Inserts or replaces an entry (restoring a snapshot).
    pub fn put(&self, tenant: &str, active: u64, buckets: TenantBuckets) {
        let (hash, shard) = self.locate(tenant);
        let mut guard = shard.write();
        if let Some(e) = guard.entries.find(hash, |e| e.id.as_str() == tenant) {
            e.active.store(active, Ordering::Release);
            *e.buckets.lock() = buckets;
            return;
        }
        let entry = Arc::new(TenantEntry {
            id: CompactString::from(tenant),
            hash,
            active: AtomicU64::new(active),
            buckets: Mutex::new(buckets),
        });
        guard.entries.insert_unique(hash, entry, |e| e.hash);
    }

    /// Keeps only the entries `keep` approves.
    pub fn retain(&self, mut keep: impl FnMut(&TenantEntry) -> bool) {
        for shard in self.shards.iter() {
            shard.write().entries.retain(|e| keep(e));
        }
    }

    /// Forgets everything. Guards still held decrement their own (now
    /// detached) entries, so they cannot disturb tenants created afterwards.
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            let mut guard = shard.write();
            guard.entries = HashTable::new();
            guard.high_water = SWEEP_FLOOR;
        }
    }

    /// Visits every entry (for snapshots and metrics).
    pub fn for_each(&self, mut f: impl FnMut(&Arc<TenantEntry>)) {
        for shard in self.shards.iter() {
            shard.read().entries.iter().for_each(&mut f);
        }
    }

    /// Number of tenants currently remembered.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().entries.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
