//! Balance strategies. `sticky` hashes (see `hash.rs`); `round-robin` and
//! `least-connections` share one rotation cursor per routing key, which —
//! as in the reference — starts at 0 and is advanced before use, so a new
//! key's first pick is candidate 1.

use super::hash::RoutingKey;
use compact_str::CompactString;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::hash::BuildHasher;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Balance {
    #[default]
    Sticky,
    RoundRobin,
    LeastConnections,
}

impl std::str::FromStr for Balance {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sticky" => Ok(Balance::Sticky),
            "round-robin" => Ok(Balance::RoundRobin),
            "least-connections" => Ok(Balance::LeastConnections),
            other => Err(format!(
                "unknown balance `{other}` (expected sticky, round-robin or least-connections)"
            )),
        }
    }
}

const CURSOR_SHARDS: usize = 64;

/// A cursor shard forgets its cursors once it holds this many keys: the
/// table stays bounded (64 × 4 096 keys) when clients invent keys, at the
/// cost of restarting those keys' rotations.
pub const CURSOR_SHARD_LIMIT: usize = 4096;

/// The reference stores `cursor mod 0x7fffffff`.
const CURSOR_MODULUS: u64 = 0x7fff_ffff;

type CursorMap = hashbrown::HashMap<CompactString, u32, foldhash::fast::RandomState>;

/// Rotation cursors per routing key.
pub struct Cursors {
    shards: Box<[CachePadded<Mutex<CursorMap>>]>,
    hasher: foldhash::fast::RandomState,
}

impl Default for Cursors {
    fn default() -> Self {
        Self::new()
    }
}

impl Cursors {
    pub fn new() -> Self {
        Cursors {
            shards: (0..CURSOR_SHARDS)
                .map(|_| CachePadded::new(Mutex::new(CursorMap::default())))
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    fn joined(key: &RoutingKey<'_>) -> CompactString {
        let mut s = CompactString::new(key.tenant);
        if let Some(channel) = key.channel {
            s.push(':');
            s.push_str(channel);
        }
        s
    }

    fn shard(&self, key: &str) -> &Mutex<CursorMap> {
        let h = self.hasher.hash_one(key);
        &self.shards[(h >> 58) as usize % CURSOR_SHARDS]
    }

    /// Advances the key's cursor and returns the value to pick with.
    pub fn advance(&self, key: &RoutingKey<'_>) -> u64 {
        let joined = Self::joined(key);
        let mut map = self.shard(&joined).lock();
        if let Some(stored) = map.get_mut(joined.as_str()) {
            let c = u64::from(*stored) + 1;
            *stored = (c % CURSOR_MODULUS) as u32;
            return c;
        }
        if map.len() >= CURSOR_SHARD_LIMIT {
            map.clear();
        }
        map.insert(joined, 1);
        1
    }

    /// The value [`Cursors::advance`] would return, without moving it.
    pub fn peek(&self, key: &RoutingKey<'_>) -> u64 {
        let joined = Self::joined(key);
        let map = self.shard(&joined).lock();
        map.get(joined.as_str()).map_or(1, |&c| u64::from(c) + 1)
    }

    pub fn clear(&self) {
        for shard in self.shards.iter() {
            shard.lock().clear();
        }
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Round-robin: candidate `cursor mod len`.
#[inline]
pub fn round_robin(cursor: u64, len: usize) -> usize {
    (cursor % len as u64) as usize
}

/// Least-connections: scan from the cursor's candidate in rotation order;
/// only a strictly lower count replaces the best, so ties follow rotation.
pub fn least_connections(cursor: u64, len: usize, active: impl Fn(usize) -> i64) -> usize {
    let start = round_robin(cursor, len);
    let mut best = start;
    let mut best_active = active(start);
    for step in 1..len {
        let i = (start + step) % len;
        let a = active(i);
        if a < best_active {
            best = i;
            best_active = a;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_pick_of_a_new_key_is_index_one() {
        let cursors = Cursors::new();
        let key = RoutingKey::new("acme", None);
        let picks: Vec<usize> = (0..4)
            .map(|_| round_robin(cursors.advance(&key), 3))
            .collect();
        assert_eq!(picks, vec![1, 2, 0, 1]);
    }

    #[test]
    fn peek_does_not_move_the_cursor() {
        let cursors = Cursors::new();
        let key = RoutingKey::new("acme", Some("x"));
        assert_eq!(cursors.peek(&key), 1);
        assert_eq!(cursors.advance(&key), 1);
        assert_eq!(cursors.peek(&key), 2);
        assert_eq!(cursors.peek(&key), 2);
    }

    #[test]
    fn joined_keys_collide_like_the_reference() {
        // "a:b" without a channel is the same key as tenant "a", channel "b".
        let cursors = Cursors::new();
        cursors.advance(&RoutingKey::new("a:b", None));
        assert_eq!(cursors.peek(&RoutingKey::new("a", Some("b"))), 2);
    }

    #[test]
    fn least_connections_ties_follow_rotation() {
        assert_eq!(least_connections(1, 3, |_| 0), 1);
        assert_eq!(least_connections(1, 3, |i| [0, 2, 1][i]), 0);
        assert_eq!(least_connections(2, 3, |i| [1, 1, 1][i]), 2);
    }

    #[test]
    fn cursor_table_stays_bounded() {
        let cursors = Cursors::new();
        for i in 0..(CURSOR_SHARD_LIMIT * 64 * 3) {
            let t = format!("t-{i}");
            cursors.advance(&RoutingKey::new(&t, None));
        }
        assert!(cursors.len() <= CURSOR_SHARD_LIMIT * 64);
    }
}
