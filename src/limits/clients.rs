//! Per-client buckets (DESIGN §10): one token bucket per tenant and client
//! address, so one client cannot spend a tenant's whole allowance.
//!
//! A client is its IPv4 address, or its IPv6 /64 (one subscriber's
//! network: a host picks any address in it). The table is bounded like the
//! tenant table: 64 locked shards; a bucket that has refilled is
//! indistinguishable from a new one and is forgotten when its shard grows,
//! and past `limits.max_tracked_clients` the least recently seen go first.
//! A bucket is written only once it spent a token, so addresses a client
//! invents while its tenant is refused cost nothing. Each slot is
//! [`SLOT_BYTES`] bytes (tenant ids of up to 24 bytes stay inline), plus
//! the hash table's control byte and spare capacity.
//!
//! Lock order: a tenant's state, then a client shard (the router checks a
//! client's bucket while it holds its tenant's lock, so the client check,
//! the tenant's and the spending of both are one step).

use super::bucket::{RateRule, TokenBucket};
use compact_str::CompactString;
use crossbeam_utils::CachePadded;
use hashbrown::HashTable;
use parking_lot::Mutex;
use std::fmt;
use std::hash::BuildHasher;
use std::net::{IpAddr, Ipv6Addr};

const TABLE_SHARDS: usize = 64;

/// A shard sweeps out refilled buckets before it grows past this many
/// (then past twice what survived).
const SWEEP_FLOOR: usize = 256;

/// `limits.max_tracked_clients` when the config does not say.
pub const DEFAULT_MAX_TRACKED_CLIENTS: usize = 1_000_000;

/// The bytes one tracked client takes in its slot.
pub const SLOT_BYTES: usize = std::mem::size_of::<Slot>();

/// A client as limits see it: an IPv4 address, or an IPv6 /64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientKey(u128);

impl ClientKey {
    /// The key of `ip`: IPv4 (also IPv4-mapped IPv6) whole, IPv6 by /64.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => ClientKey(u128::from(v4.to_ipv6_mapped())),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => ClientKey(u128::from(v4.to_ipv6_mapped())),
                None => ClientKey(u128::from(v6) & !u128::from(u64::MAX)),
            },
        }
    }

    /// A client as [`ClientKey`]'s `Display` writes it, or any address.
    pub fn parse(text: &str) -> Option<Self> {
        let address = text.strip_suffix("/64").unwrap_or(text);
        address.parse().ok().map(ClientKey::of)
    }

    /// An address whose key this is (an IPv6 network's first).
    pub fn address(self) -> IpAddr {
        Ipv6Addr::from(self.0).to_canonical()
    }

    fn halves(self) -> [u64; 2] {
        [(self.0 >> 64) as u64, self.0 as u64]
    }

    fn from_halves(h: [u64; 2]) -> Self {
        ClientKey((u128::from(h[0]) << 64) | u128::from(h[1]))
    }
}

/// `203.0.113.7`, or `2001:db8:1:2::/64`.
impl fmt::Display for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => write!(f, "{v4}"),
            None => write!(f, "{v6}/64"),
        }
    }
}

struct Slot {
    tenant: CompactString,
    /// The key's two halves (a `u128` would align the slot to 16 bytes).
    client: [u64; 2],
    bucket: TokenBucket,
    /// When the bucket is full again (clock ms; ∞ if it never refills),
    /// under the rule it last spent by: past it the slot may be
    /// forgotten. (A plan that grew since may see it forgotten before it
    /// is full by the new rule: the client then starts full, by that
    /// rule.)
    full_at: f64,
    /// When it last spent a token (clock ms): the least recent go first.
    seen: f64,
}

/// The client's bucket at `now` under `rule`: its slot's refilled, cut to
/// the rule's capacity (the tenant's plan may have shrunk), else full.
fn current(slot: Option<&Slot>, rule: &RateRule, now: f64) -> TokenBucket {
    let mut bucket = slot.map_or_else(|| TokenBucket::full(rule, now), |s| s.bucket);
    bucket.refill(rule, now);
    bucket.tokens = bucket.tokens.min(rule.tokens);
    bucket
}

/// When `bucket` is full again under `rule` (clock ms; ∞ if never).
fn full_at(bucket: &TokenBucket, rule: &RateRule) -> f64 {
    match rule.refill_per_second > 0.0 {
        true => {
            bucket.last_refill_at + (rule.tokens - bucket.tokens) * 1000.0 / rule.refill_per_second
        }
        false => f64::INFINITY,
    }
}

struct ClientShard {
    slots: HashTable<Slot>,
    high_water: usize,
}

/// A tracked client's bucket, as the state file keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct TrackedClient {
    pub tenant: CompactString,
    pub client: ClientKey,
    pub bucket: TokenBucket,
}

/// What a client's bucket says of one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ClientCheck {
    /// It holds a token.
    Has,
    /// It is empty: seconds until it holds one (`None`: never).
    Empty(Option<f64>),
}

/// Tenant and client address → bucket, bounded.
pub struct ClientTable {
    shards: Box<[CachePadded<Mutex<ClientShard>>]>,
    shard_cap: usize,
    hasher: foldhash::fast::RandomState,
}

impl Default for ClientTable {
    fn default() -> Self {
        ClientTable::bounded(DEFAULT_MAX_TRACKED_CLIENTS)
    }
}

impl ClientTable {
    /// A table that tracks about `max` clients at most (rounded down to a
    /// multiple of its shard count, at least one per shard).
    pub fn bounded(max: usize) -> Self {
        let shard_cap = (max / TABLE_SHARDS).max(1);
        ClientTable {
            shards: (0..TABLE_SHARDS)
                .map(|_| {
                    CachePadded::new(Mutex::new(ClientShard {
                        slots: HashTable::new(),
                        high_water: SWEEP_FLOOR.min(shard_cap),
                    }))
                })
                .collect(),
            shard_cap,
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    fn hash(&self, tenant: &str, client: [u64; 2]) -> u64 {
        self.hasher.hash_one((tenant, client))
    }

    fn shard(&self, hash: u64) -> &Mutex<ClientShard> {
        // hashbrown takes its slot from the low bits and its tag from the
        // top seven: the shard comes from bits in between.
        &self.shards[(hash >> 32) as usize % TABLE_SHARDS]
    }

    /// Checks the client's bucket under `rule` at `now`, then runs
    /// `rest` (the tenant's own checks) with the shard locked; if `rest`
    /// says so, spends one of the client's tokens. An empty bucket does
    /// not run `rest` at all. Returns `rest`'s answer, or `None` if the
    /// client's bucket was empty (with the seconds until a token).
    pub fn check<R>(
        &self,
        tenant: &str,
        client: ClientKey,
        rule: &RateRule,
        now: f64,
        rest: impl FnOnce() -> (R, bool),
    ) -> Result<R, Option<f64>> {
        let client = client.halves();
        let hash = self.hash(tenant, client);
        let mut guard = self.shard(hash).lock();
        let shard = &mut *guard;
        let same = |s: &Slot| s.client == client && s.tenant == tenant;
        let found = shard.slots.find_mut(hash, same);
        let mut bucket = current(found.as_deref(), rule, now);
        if !bucket.has_token() {
            return Err(bucket.seconds_until_token(rule));
        }
        let (answer, spend) = rest();
        if !spend {
            return Ok(answer);
        }
        bucket.take();
        let full_at = full_at(&bucket, rule);
        match found {
            Some(slot) => {
                slot.bucket = bucket;
                slot.full_at = full_at;
                slot.seen = now;
            }
            None => {
                let slot = Slot {
                    tenant: CompactString::from(tenant),
                    client,
                    bucket,
                    full_at,
                    seen: now,
                };
                self.make_room(shard, now);
                (shard.slots).insert_unique(hash, slot, |s| self.hash(&s.tenant, s.client));
            }
        }
        Ok(answer)
    }

    /// What the client's bucket holds at `now` under `rule`, changing
    /// nothing (the explain endpoint).
    pub fn peek(&self, tenant: &str, client: ClientKey, rule: &RateRule, now: f64) -> ClientCheck {
        let client = client.halves();
        let hash = self.hash(tenant, client);
        let shard = self.shard(hash).lock();
        let found = shard
            .slots
            .find(hash, |s| s.client == client && s.tenant == tenant);
        let bucket = current(found, rule, now);
        match bucket.has_token() {
            true => ClientCheck::Has,
            false => ClientCheck::Empty(bucket.seconds_until_token(rule)),
        }
    }

    /// Before a shard grows past its high-water mark: forgets the buckets
    /// that have refilled, then, if more than three quarters of its share
    /// of the bound are left, the least recently seen down to that. The
    /// next sweep is then at least a quarter of the share of new clients
    /// away, whatever an attacker keeps alive: a sweep's cost is spread
    /// over as many inserts.
    fn make_room(&self, shard: &mut ClientShard, now: f64) {
        if shard.slots.len() < shard.high_water {
            return;
        }
        shard.slots.retain(|s| s.full_at > now);
        let target = self.shard_cap - (self.shard_cap / 4).max(1);
        if shard.slots.len() > target {
            let excess = shard.slots.len() - target;
            let mut stamps: Vec<f64> = shard.slots.iter().map(|s| s.seen).collect();
            let (_, cut, _) = stamps.select_nth_unstable_by(excess - 1, f64::total_cmp);
            let cut = *cut;
            let mut left = excess;
            shard.slots.retain(|s| {
                let go = left > 0 && s.seen <= cut;
                left -= usize::from(go);
                !go
            });
        }
        shard.slots.shrink_to(0, |s| self.hash(&s.tenant, s.client));
        let survivors = shard.slots.len();
        shard.high_water = SWEEP_FLOOR.max(survivors * 2).min(self.shard_cap);
    }

    /// Clients tracked now.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().slots.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buckets not yet refilled at `now` (a refilled one is as good
    /// as none): what a restart must keep.
    pub fn unrefilled(&self, now: f64) -> Vec<TrackedClient> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock();
            out.extend(
                shard
                    .slots
                    .iter()
                    .filter(|s| s.full_at > now)
                    .map(|s| TrackedClient {
                        tenant: s.tenant.clone(),
                        client: ClientKey::from_halves(s.client),
                        bucket: s.bucket,
                    }),
            );
        }
        out
    }

    /// Puts a bucket back (restoring a snapshot), already checked against
    /// its rule.
    pub fn put(&self, tracked: TrackedClient, rule: &RateRule, now: f64) {
        let client = tracked.client.halves();
        let hash = self.hash(&tracked.tenant, client);
        let mut guard = self.shard(hash).lock();
        let shard = &mut *guard;
        let tenant = tracked.tenant;
        let b = tracked.bucket;
        let full_at = full_at(&b, rule);
        let same = |s: &Slot| s.client == client && s.tenant == tenant;
        if let Some(slot) = shard.slots.find_mut(hash, same) {
            slot.bucket = b;
            slot.full_at = full_at;
            return;
        }
        self.make_room(shard, now);
        let slot = Slot {
            tenant,
            client,
            bucket: b,
            full_at,
            seen: now,
        };
        (shard.slots).insert_unique(hash, slot, |s| self.hash(&s.tenant, s.client));
    }

    /// Forgets every bucket.
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            shard.slots = HashTable::new();
            shard.high_water = SWEEP_FLOOR.min(self.shard_cap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> ClientKey {
        ClientKey::of(text.parse().expect("an address"))
    }

    #[test]
    fn a_client_is_its_ipv4_address_or_its_ipv6_64() {
        assert_ne!(key("203.0.113.7"), key("203.0.113.8"));
        assert_eq!(key("203.0.113.7"), key("::ffff:203.0.113.7"));
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff::9"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("203.0.113.7").to_string(), "203.0.113.7");
        assert_eq!(key("2001:db8:1:2:3::9").to_string(), "2001:db8:1:2::/64");
        for text in ["203.0.113.7", "2001:db8:1:2::/64", "::1"] {
            let k = ClientKey::parse(text).expect("parses");
            assert_eq!(ClientKey::parse(&k.to_string()), Some(k));
            assert_eq!(ClientKey::of(k.address()), k);
        }
        assert_eq!(ClientKey::parse("nobody"), None);
    }

    /// Spends one token if the client has one, the rest admitting.
    fn spend(t: &ClientTable, tenant: &str, client: ClientKey, rule: &RateRule, now: f64) -> bool {
        t.check(tenant, client, rule, now, || ((), true)).is_ok()
    }

    #[test]
    fn each_client_of_each_tenant_has_its_own_bucket() {
        let t = ClientTable::default();
        let rule = RateRule::new(2.0, 1.0);
        let (a, b) = (key("192.0.2.1"), key("192.0.2.2"));
        assert!(spend(&t, "acme", a, &rule, 0.0));
        assert!(spend(&t, "acme", a, &rule, 0.0));
        assert!(!spend(&t, "acme", a, &rule, 0.0), "a's bucket is empty");
        assert!(spend(&t, "acme", b, &rule, 0.0), "b has its own");
        assert!(
            spend(&t, "globex", a, &rule, 0.0),
            "and a, its own per tenant"
        );
        assert_eq!(
            t.check("acme", a, &rule, 0.0, || -> ((), bool) {
                panic!("not run")
            }),
            Err(Some(1.0)),
            "an empty bucket refuses before the tenant's checks, saying when"
        );
        assert_eq!(
            t.peek("acme", a, &rule, 500.0),
            ClientCheck::Empty(Some(0.5))
        );
        assert!(spend(&t, "acme", a, &rule, 1_000.0), "refilled one");
    }

    #[test]
    fn a_bucket_is_written_only_once_it_spent() {
        let t = ClientTable::default();
        let rule = RateRule::new(5.0, 1.0);
        for i in 0..1_000u32 {
            let client = ClientKey::of(std::net::Ipv4Addr::from(i).into());
            let refused = t.check("acme", client, &rule, 0.0, || ((), false));
            assert_eq!(refused, Ok(()));
        }
        assert_eq!(t.len(), 0, "a tenant refusing spends no client's token");
    }

    #[test]
    fn invented_addresses_are_bounded() {
        // Buckets that refill are forgotten once refilled; those that
        // never refill, least recently seen first past the bound.
        // One token each: the last client's bucket is empty while tracked
        // (a forgotten one would read full).
        for (rule, at) in [
            (RateRule::new(1.0, 1.0), 10_000.0),
            (RateRule::new(1.0, 0.0), 1.0),
        ] {
            let t = ClientTable::bounded(6_400);
            for i in 0..100_000u32 {
                let client = ClientKey::of(std::net::Ipv4Addr::from(i).into());
                assert!(spend(&t, "acme", client, &rule, f64::from(i) * at));
            }
            assert!(t.len() <= 6_400, "{} tracked", t.len());
            let recent = ClientKey::of(std::net::Ipv4Addr::from(99_999u32).into());
            let now = 99_999.0 * at;
            let tokens = t.peek("acme", recent, &rule, now);
            assert!(matches!(tokens, ClientCheck::Empty(_)), "{tokens:?}");
            assert!(t.unrefilled(now).iter().any(|c| c.client == recent));
        }
    }
}
