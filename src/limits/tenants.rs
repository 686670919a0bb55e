//! The tenant table: per-tenant live connections and token buckets, shared by
//! every worker thread.
//!
//! Each tenant's state sits behind its own small lock. The table that finds
//! it is split into 64 locked shards, and in front of it every thread keeps a
//! small cache of the entries it used recently, so a warm lookup writes no
//! cache line that another thread's tenants use: distinct tenants scale
//! across cores. Entries that carry no information (idle, buckets full) are
//! forgotten when a shard grows, so invented tenant ids cannot grow the table
//! without bound; a forgotten entry is marked dead under its own lock, and a
//! thread that finds a dead entry in its cache goes back to the table.
//! Entries that do carry information but never lose it (a bucket that never
//! refills) are bounded too: past `limits.max_tracked_tenants` the least
//! recently seen idle ones go first.

use super::bucket::TokenBucket;
use compact_str::CompactString;
use crossbeam_utils::CachePadded;
use hashbrown::HashTable;
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;
use std::cell::RefCell;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use thread_local::ThreadLocal;

const TABLE_SHARDS: usize = 64;

/// A thread's cache starts over once it holds this many entries.
const LOCAL_ENTRIES: usize = 4096;

/// A table shard sweeps out forgettable entries before it grows past this
/// many entries (and then past twice what survived the sweep). With 64
/// shards the table holds at most `64 × 256` entries plus twice the number
/// of tenants that are active or have spent tokens not yet refilled; each
/// worker thread's cache may keep up to 4 096 more (possibly forgotten)
/// entries alive in memory.
pub const SWEEP_FLOOR: usize = 256;

/// The bound [`SWEEP_FLOOR`] gives when every tenant is forgettable.
pub const FORGETTABLE_BOUND: usize = TABLE_SHARDS * SWEEP_FLOOR;

/// `limits.max_tracked_tenants` when the config does not say.
pub const DEFAULT_MAX_TRACKED: usize = 1_000_000;

/// The buckets of one tenant: its own, and one per limited route it used.
#[derive(Clone, Debug)]
pub struct TenantBuckets {
    pub tenant: TokenBucket,
    /// `(route index, bucket)`, created on the route's first use.
    pub routes: SmallVec<[(u16, TokenBucket); 2]>,
}

/// A tenant's mutable state, behind the entry's lock.
#[derive(Debug)]
pub struct TenantState {
    /// False once the entry left the table (forgotten, cleared, replaced):
    /// whoever still holds it must look the tenant up again.
    alive: bool,
    pub buckets: TenantBuckets,
    /// `(membership generation, shard position)` of the tenant's last
    /// deterministic sticky pick over the unfiltered live list: valid while
    /// the generation is current.
    pub placement: Option<(u64, u32)>,
    /// Cluster mode only: the node's lease on this tenant (see
    /// [`super::SharedSlot`]); `None` = no lease yet.
    pub shared: Option<Box<super::SharedSlot>>,
    /// The tenant's plan as last looked up.
    pub plan: super::plans::PlanCache,
}

/// One tenant. Admission guards hold it to release their count.
#[derive(Debug)]
pub struct TenantEntry {
    id: CompactString,
    hash: u64,
    /// Live admissions. Incremented only under `state`'s lock (so a cap
    /// check and its increment are one step); decremented lock-free by
    /// guards, which can only make a later check more permissive.
    pub(crate) active: AtomicU64,
    /// When the tenant was last looked up to be routed or admitted (clock
    /// milliseconds): the least recently seen go first past the bound.
    seen: AtomicU64,
    state: Mutex<TenantState>,
}

impl TenantEntry {
    fn new(id: &str, hash: u64, active: u64, buckets: TenantBuckets) -> Arc<Self> {
        Arc::new(TenantEntry {
            id: CompactString::from(id),
            hash,
            active: AtomicU64::new(active),
            seen: AtomicU64::new(0),
            state: Mutex::new(TenantState {
                alive: true,
                buckets,
                placement: None,
                shared: None,
                plan: Default::default(),
            }),
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn active(&self) -> u64 {
        self.active.load(Ordering::Acquire)
    }

    fn see(&self, now: u64) {
        // Relaxed, and only when it moves: a stamp that lags by a race
        // costs an eviction order, nothing else.
        if self.seen.load(Ordering::Relaxed) != now {
            self.seen.store(now, Ordering::Relaxed);
        }
    }

    /// Decrements `active`, never below zero.
    pub(crate) fn release(&self) {
        let _ = self
            .active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| a.checked_sub(1));
    }

    /// Locks the state; `None` if the entry is dead.
    fn lock_alive(&self) -> Option<MutexGuard<'_, TenantState>> {
        let state = self.state.lock();
        state.alive.then_some(state)
    }

    /// Marks the entry dead (it is leaving the table).
    fn kill(&self) {
        self.state.lock().alive = false;
    }
}

struct TableShard {
    entries: HashTable<Arc<TenantEntry>>,
    high_water: usize,
}

impl TableShard {
    fn find(&self, hash: u64, tenant: &str) -> Option<&Arc<TenantEntry>> {
        self.entries.find(hash, |e| e.id.as_str() == tenant)
    }

    /// Forgets the least recently seen entries that hold no admission
    /// until at most `target` remain (or none of those is left). Each is
    /// marked dead under its own lock, after checking again that nothing
    /// was admitted meanwhile (admissions take that lock). In cluster mode
    /// an entry may hold a lease: forgotten, the lease is left to Redis,
    /// which drops it as spent once its stamp is stale, and the credit it
    /// owed is not charged (one opening share, at most, handed back).
    fn evict_least_recent(&mut self, target: usize) {
        let excess = self.entries.len().saturating_sub(target);
        if excess == 0 {
            return;
        }
        let idle = |e: &TenantEntry| e.active() == 0;
        // Only entries that may go: the cut is then theirs, and `left`
        // reaches zero unless one was admitted meanwhile.
        let mut stamps: Vec<u64> = (self.entries.iter())
            .filter(|e| idle(e))
            .map(|e| e.seen.load(Ordering::Relaxed))
            .collect();
        if stamps.is_empty() {
            return;
        }
        let k = excess.min(stamps.len());
        let (_, &mut cut, _) = stamps.select_nth_unstable(k - 1);
        let mut left = k;
        self.entries.retain(|e| {
            if left == 0 || !idle(e) || e.seen.load(Ordering::Relaxed) > cut {
                return true;
            }
            let mut state = e.state.lock();
            if !idle(e) {
                return true;
            }
            state.alive = false;
            left -= 1;
            false
        });
    }
}

type LocalCache = RefCell<HashTable<Arc<TenantEntry>>>;

/// Concurrent map tenant id → [`TenantEntry`].
pub struct TenantTable {
    shards: Box<[CachePadded<Mutex<TableShard>>]>,
    /// Entries a table shard holds at most before its least recently seen
    /// idle ones are forgotten (`limits.max_tracked_tenants` / shards).
    shard_cap: usize,
    hasher: foldhash::fast::RandomState,
    local: ThreadLocal<LocalCache>,
}

impl Default for TenantTable {
    fn default() -> Self {
        Self::new()
    }
}

impl TenantTable {
    pub fn new() -> Self {
        Self::bounded(DEFAULT_MAX_TRACKED)
    }

    /// A table that holds about `max` tenants at most (rounded down to a
    /// multiple of its shard count, at least one per shard), plus what
    /// threads' caches keep alive.
    pub fn bounded(max: usize) -> Self {
        let shard_cap = (max / TABLE_SHARDS).max(1);
        TenantTable {
            shards: (0..TABLE_SHARDS)
                .map(|_| {
                    CachePadded::new(Mutex::new(TableShard {
                        entries: HashTable::new(),
                        high_water: SWEEP_FLOOR.min(shard_cap),
                    }))
                })
                .collect(),
            shard_cap,
            hasher: foldhash::fast::RandomState::default(),
            local: ThreadLocal::new(),
        }
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Mutex<TableShard> {
        // hashbrown takes its slot from the low bits and its tag from the
        // top seven: the shard comes from bits in between.
        &self.shards[(hash >> 32) as usize % TABLE_SHARDS]
    }

    fn cache(&self) -> &LocalCache {
        self.local.get_or(|| RefCell::new(HashTable::new()))
    }

    /// The tenant's entry from this thread's cache, if it is there.
    #[inline]
    fn cached(&self, hash: u64, tenant: &str) -> Option<Arc<TenantEntry>> {
        let cache = self.cache().borrow();
        cache
            .find(hash, |e| e.id.as_str() == tenant)
            .map(Arc::clone)
    }

    /// Puts an entry in this thread's cache (replacing a dead one).
    fn remember(&self, entry: &Arc<TenantEntry>) {
        let Ok(mut cache) = self.cache().try_borrow_mut() else {
            return;
        };
        if cache.len() >= LOCAL_ENTRIES {
            cache.clear();
        }
        match cache.entry(entry.hash, |e| e.id == entry.id, |e| e.hash) {
            hashbrown::hash_table::Entry::Occupied(mut o) => *o.get_mut() = Arc::clone(entry),
            hashbrown::hash_table::Entry::Vacant(v) => {
                v.insert(Arc::clone(entry));
            }
        }
    }

    /// Runs `f` on the tenant's live entry and its locked state, if the
    /// tenant is known.
    pub fn with_existing<R>(
        &self,
        tenant: &str,
        f: impl FnOnce(&Arc<TenantEntry>, &mut TenantState) -> R,
    ) -> Option<R> {
        let hash = self.hasher.hash_one(tenant);
        if let Some(entry) = self.cached(hash, tenant) {
            let state = entry.lock_alive();
            if let Some(mut state) = state {
                return Some(f(&entry, &mut state));
            }
        }
        // Not cached, or the cached entry was forgotten (it stays dead in
        // this thread's cache until replaced): the table holds the truth.
        // An entry found there dies only once out of it, so this ends.
        loop {
            let entry = Arc::clone(self.shard(hash).lock().find(hash, tenant)?);
            let state = entry.lock_alive();
            if let Some(mut state) = state {
                return Some(f(&entry, &mut state));
            }
        }
    }

    /// Runs `f` on the tenant's entry and its locked state, creating the
    /// entry with `fresh` if missing, and stamps it seen at `now` (clock
    /// milliseconds). Before a table shard grows past its high-water mark
    /// it forgets every entry `forgettable` approves, then, if it still
    /// holds its share of the bound, the least recently seen idle entries
    /// down to three quarters of it (an entry `f` holds cannot be
    /// forgotten meanwhile: forgetting takes the entry's lock).
    pub fn with_entry<R>(
        &self,
        tenant: &str,
        now: u64,
        fresh: impl Fn() -> TenantBuckets,
        forgettable: impl Fn(&Arc<TenantEntry>, &TenantState) -> bool,
        f: impl FnOnce(&Arc<TenantEntry>, &mut TenantState) -> R,
    ) -> R {
        let hash = self.hasher.hash_one(tenant);
        {
            // Warm path: this thread's cache, no shared write but the
            // entry's own lock.
            let cache = self.cache().borrow();
            if let Some(entry) = cache.find(hash, |e| e.id.as_str() == tenant) {
                let state = entry.lock_alive();
                if let Some(mut state) = state {
                    entry.see(now);
                    return f(entry, &mut state);
                }
            }
        }
        loop {
            let entry = self.find_or_insert(hash, tenant, &fresh, &forgettable);
            self.remember(&entry);
            let state = entry.lock_alive();
            if let Some(mut state) = state {
                entry.see(now);
                return f(&entry, &mut state);
            }
        }
    }

    fn find_or_insert(
        &self,
        hash: u64,
        tenant: &str,
        fresh: &impl Fn() -> TenantBuckets,
        forgettable: &impl Fn(&Arc<TenantEntry>, &TenantState) -> bool,
    ) -> Arc<TenantEntry> {
        let mut guard = self.shard(hash).lock();
        let shard = &mut *guard;
        if let Some(e) = shard.find(hash, tenant) {
            return Arc::clone(e);
        }
        if shard.entries.len() >= shard.high_water {
            shard.entries.retain(|e| {
                let mut state = e.state.lock();
                let forget = forgettable(e, &state);
                state.alive &= !forget;
                !forget
            });
            if shard.entries.len() >= self.shard_cap {
                shard.evict_least_recent(self.shard_cap - (self.shard_cap / 4).max(1));
            }
            shard.entries.shrink_to(0, |e| e.hash);
            // Twice what survived, up to the bound (a quarter of it more
            // than what survives an eviction). What survived past the bound
            // cannot go (admissions): twice that, so that a sweep
            // still comes once per as many new tenants as it walks.
            let survivors = shard.entries.len();
            shard.high_water = match survivors >= self.shard_cap {
                true => survivors * 2,
                false => SWEEP_FLOOR.max(survivors * 2).min(self.shard_cap),
            };
        }
        let entry = TenantEntry::new(tenant, hash, 0, fresh());
        shard
            .entries
            .insert_unique(hash, Arc::clone(&entry), |e| e.hash);
        entry
    }

    /// Inserts or overwrites a tenant's state (restoring a snapshot). An
    /// existing entry keeps its identity, so guards taken before still
    /// release against it.
    pub fn put(&self, tenant: &str, active: u64, buckets: TenantBuckets) {
        let hash = self.hasher.hash_one(tenant);
        let mut shard = self.shard(hash).lock();
        if let Some(e) = shard.find(hash, tenant) {
            let mut state = e.state.lock();
            e.active.store(active, Ordering::Release);
            state.buckets = buckets;
            state.placement = None;
            return;
        }
        let entry = TenantEntry::new(tenant, hash, active, buckets);
        shard.entries.insert_unique(hash, entry, |e| e.hash);
    }

    /// Keeps only the entries `keep` approves; the others die.
    pub fn retain(&self, mut keep: impl FnMut(&TenantEntry) -> bool) {
        for shard in self.shards.iter() {
            shard.lock().entries.retain(|e| {
                let kept = keep(e);
                if !kept {
                    e.kill();
                }
                kept
            });
        }
    }

    /// Forgets everything. Guards still held decrement their own (now
    /// dead) entries, so they cannot disturb tenants created afterwards.
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            let mut guard = shard.lock();
            for e in guard.entries.iter() {
                e.kill();
            }
            guard.entries = HashTable::new();
            guard.high_water = SWEEP_FLOOR.min(self.shard_cap);
        }
    }

    /// Visits every live entry with its state (for snapshots).
    pub fn for_each(&self, mut f: impl FnMut(&TenantEntry, &TenantState)) {
        for shard in self.shards.iter() {
            for e in shard.lock().entries.iter() {
                f(e, &e.state.lock());
            }
        }
    }

    /// Number of tenants currently in the table.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().entries.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
