//! Request IDs (DESIGN §7): one per request, made when its context is, on
//! every answer (proxied or shardgate's own), on the upstream request and
//! in the access log.
//!
//! An ID of shardgate's own is 128 bits as 22 base64url characters: the
//! thread's number and the thread's own count, through a permutation of
//! the 128 bits keyed with the process's random SipHash key (a 3-round
//! Feistel network). Two requests never share an ID within a process
//! (distinct threads or distinct counts), an ID tells nothing of the
//! thread or the count without the key (so neither the traffic nor the
//! next ID can be read off one), and no request writes a shared cache line
//! to get one.

use compact_str::CompactString;
use std::cell::Cell;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// A request's ID: 22 characters of ours (inline, no allocation), or a
/// trusted client's value.
pub type RequestId = CompactString;

/// The longest client value kept (`trust_incoming`).
pub const MAX_INCOMING: usize = 128;

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

thread_local! {
    /// This thread's number and count (the number taken on first use).
    static NEXT: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

/// A new ID of shardgate's own.
pub fn new_id() -> RequestId {
    static THREADS: AtomicU64 = AtomicU64::new(0);
    let (thread, count) = NEXT.with(|next| {
        let (thread, count) = next
            .get()
            .unwrap_or_else(|| (THREADS.fetch_add(1, Ordering::Relaxed), 0));
        next.set(Some((thread, count.wrapping_add(1))));
        (thread, count)
    });
    let (left, right) = permute(key(), thread, count);
    encode(u128::from(left) << 64 | u128::from(right))
}

/// A client's value as the request's ID (`trust_incoming`), if it is
/// well-formed.
pub fn trusted(incoming: &[u8]) -> Option<RequestId> {
    // Well-formed is ASCII.
    is_well_formed(incoming)
        .then(|| CompactString::from(std::str::from_utf8(incoming).unwrap_or_default()))
}

/// Whether a client's value may be kept: 1–128 of `[A-Za-z0-9._-]`.
pub fn is_well_formed(value: &[u8]) -> bool {
    (1..=MAX_INCOMING).contains(&value.len())
        && value
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The process's key: std's SipHash-1-3 with keys from the system's
/// randomness.
fn key() -> &'static RandomState {
    static KEY: OnceLock<RandomState> = OnceLock::new();
    KEY.get_or_init(RandomState::new)
}

/// The Feistel network's rounds: three keyed-PRF rounds make a
/// pseudorandom permutation (Luby–Rackoff), which is what an ID needs:
/// unreadable to one who sees IDs (nobody can ask for an ID's inverse, the
/// fourth round's purpose). Each round is a SipHash, ~290 instructions.
const ROUNDS: u8 = 3;

/// A keyed permutation of 128 bits (a Feistel network over two 64-bit
/// halves, each round keyed SipHash): invertible, so distinct inputs give
/// distinct IDs, and unreadable without the key.
fn permute(key: &RandomState, mut left: u64, mut right: u64) -> (u64, u64) {
    for round in 0..ROUNDS {
        (left, right) = (right, left ^ key.hash_one((round, right)));
    }
    (left, right)
}

/// 128 bits as 22 base64url characters (the last one holds 2 bits).
fn encode(mut x: u128) -> RequestId {
    let mut out = [0u8; 22];
    for c in out.iter_mut() {
        *c = ALPHABET[(x & 63) as usize];
        x >>= 6;
    }
    // The alphabet is ASCII.
    CompactString::from(std::str::from_utf8(&out).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ids_are_unique_and_22_url_safe_characters() {
        let ids: HashSet<RequestId> = (0..100_000).map(|_| new_id()).collect();
        assert_eq!(ids.len(), 100_000);
        for id in ids.iter().take(100) {
            assert_eq!(id.len(), 22);
            assert!(is_well_formed(id.as_bytes()), "{id}");
            assert!(!id.is_heap_allocated());
        }
        // Another thread's IDs are none of these.
        let theirs = std::thread::spawn(|| (0..10_000).map(|_| new_id()).collect::<Vec<_>>())
            .join()
            .unwrap_or_default();
        assert_eq!(theirs.len(), 10_000);
        assert!(theirs.iter().all(|id| !ids.contains(id)));
    }

    #[test]
    fn the_permutation_is_undone_with_the_key_only() {
        // Each round undone in turn gives the input back: distinct inputs
        // have distinct IDs.
        let unpermute = |key: &RandomState, mut left: u64, mut right: u64| {
            for round in (0..ROUNDS).rev() {
                (left, right) = (right ^ key.hash_one((round, left)), left);
            }
            (left, right)
        };
        let other = RandomState::new();
        for (thread, count) in [(0, 0), (0, 1), (1, 0), (7, u64::MAX), (u64::MAX, 12345)] {
            let (l, r) = permute(key(), thread, count);
            assert_eq!(unpermute(key(), l, r), (thread, count));
            assert_ne!((l, r), (thread, count));
            // Another key reads another input: the ID alone tells nothing.
            assert_ne!(unpermute(&other, l, r), (thread, count));
        }
    }

    #[test]
    fn a_clients_value_is_kept_only_when_well_formed() {
        assert_eq!(trusted(b"abc-123_x.y").as_deref(), Some("abc-123_x.y"));
        for bad in [&b""[..], b"a b", b"a/b", b"a:b", b"\xff", &[b'a'; 129]] {
            assert_eq!(trusted(bad), None, "{bad:?}");
        }
        assert_eq!(trusted(&[b'a'; 128]).map(|id| id.len()), Some(128));
    }
}
