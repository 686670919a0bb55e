//! Request IDs (DESIGN §7): one per request, made when its context is, on
//! every answer (proxied or shardgate's own), on the upstream request and
//! in the access log.
//!
//! An ID of shardgate's own is 128 bits as 22 base64url characters: the
//! thread's number and the thread's own count, as one block encrypted with
//! AES-128 under the process's random key. Two requests never share an ID
//! within a process (distinct threads or distinct counts, and a block
//! cipher is a permutation), an ID tells nothing of the thread or the
//! count without the key (so neither the traffic nor the next ID can be
//! read off one), and no request writes a shared cache line to get one.
//! With the CPU's AES instructions (detected at run time) an ID costs
//! about 60 instructions; the 3-round SipHash Feistel network it replaced
//! cost about 950.

use aes::cipher::{BlockEncrypt, KeyInit};
use aes::Aes128;
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
    encode(permute(key(), thread, count))
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

/// The process's key: 128 bits drawn through std's SipHash, whose own key
/// comes from the system's randomness.
fn key() -> &'static Aes128 {
    static KEY: OnceLock<Aes128> = OnceLock::new();
    KEY.get_or_init(|| {
        let random = RandomState::new();
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&random.hash_one(0u8).to_le_bytes());
        key[8..].copy_from_slice(&random.hash_one(1u8).to_le_bytes());
        Aes128::new(&key.into())
    })
}

/// A keyed permutation of 128 bits (one AES block): distinct inputs give
/// distinct IDs, unreadable without the key.
fn permute(key: &Aes128, left: u64, right: u64) -> u128 {
    let mut block = (u128::from(left) << 64 | u128::from(right))
        .to_le_bytes()
        .into();
    key.encrypt_block(&mut block);
    u128::from_le_bytes(block.into())
}

/// 128 bits as 22 base64url characters (the last one holds 2 bits).
fn encode(mut x: u128) -> RequestId {
    let mut out = [0u8; 22];
    for c in out.iter_mut() {
        *c = ALPHABET[(x & 63) as usize];
        x >>= 6;
    }
    // The alphabet is ASCII.
    CompactString::from(crate::wire::text::text(&out).unwrap_or_default())
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
        use aes::cipher::BlockDecrypt;
        // Decrypted, an ID's block gives the input back: distinct inputs
        // have distinct IDs.
        let unpermute = |key: &Aes128, x: u128| {
            let mut block = x.to_le_bytes().into();
            key.decrypt_block(&mut block);
            let x = u128::from_le_bytes(block.into());
            ((x >> 64) as u64, x as u64)
        };
        let other = Aes128::new(&[7u8; 16].into());
        for (thread, count) in [(0, 0), (0, 1), (1, 0), (7, u64::MAX), (u64::MAX, 12345)] {
            let x = permute(key(), thread, count);
            assert_eq!(unpermute(key(), x), (thread, count));
            assert_ne!(x, u128::from(thread) << 64 | u128::from(count));
            // Another key reads another input: the ID alone tells nothing.
            assert_ne!(unpermute(&other, x), (thread, count));
        }
    }

    #[test]
    fn the_permutation_is_aes_128() {
        // FIPS-197, appendix C.1: the key 00 01 .. 0f encrypts the block
        // 00 11 .. ff to 69 c4 .. 5a; `permute` takes its block as two
        // halves, read little-endian.
        let key = Aes128::new(&std::array::from_fn::<u8, 16, _>(|i| i as u8).into());
        let plain = 0x00112233445566778899aabbccddeeff_u128.to_be_bytes();
        let half =
            |r: std::ops::Range<usize>| u64::from_le_bytes(plain[r].try_into().unwrap_or_default());
        let x = permute(&key, half(8..16), half(0..8));
        assert_eq!(
            x.to_le_bytes(),
            0x69c4e0d86a7b0430d8cdb78070b4c55a_u128.to_be_bytes()
        );
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
