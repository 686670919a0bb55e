//! Placement hashes. `fnv1a32`, `jump` and `rendezvous` reproduce
//! `@absolutejs/router` bit for bit (UTF-16 code units, integer jump
//! division, `w·(−ln u)` with strict `>`), so tenants migrating from it do not
//! move. `hrw` is the well-spread weighted rendezvous we recommend instead.

use std::fmt;

const FNV_OFFSET: u32 = 0x811c_9dc5;
const FNV_PRIME: u32 = 0x0100_0193;

/// Streaming FNV-1a 32-bit over UTF-16 code units, so a key made of parts
/// (`tenant`, `":"`, `channel`, `"|"`, shard id) hashes without being joined.
#[derive(Clone, Copy, Debug)]
pub struct Fnv1a32(u32);

impl Fnv1a32 {
    #[inline]
    pub fn new() -> Self {
        Fnv1a32(FNV_OFFSET)
    }

    #[inline]
    pub fn write_str(&mut self, s: &str) {
        let mut h = self.0;
        if s.is_ascii() {
            // An ASCII byte is one UTF-16 code unit of the same value.
            for &b in s.as_bytes() {
                h = (h ^ u32::from(b)).wrapping_mul(FNV_PRIME);
            }
        } else {
            for unit in s.encode_utf16() {
                h = (h ^ u32::from(unit)).wrapping_mul(FNV_PRIME);
            }
        }
        self.0 = h;
    }

    #[inline]
    pub fn finish(self) -> u32 {
        self.0
    }
}

impl Default for Fnv1a32 {
    fn default() -> Self {
        Self::new()
    }
}

/// FNV-1a 32-bit of a string's UTF-16 code units, as the reference computes it.
pub fn fnv1a32(s: &str) -> u32 {
    let mut h = Fnv1a32::new();
    h.write_str(s);
    h.finish()
}

/// The routing key: `tenant`, or `tenant:channel` when a channel is given
/// (an empty channel counts). Kept as parts so hot paths never allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoutingKey<'a> {
    pub tenant: &'a str,
    pub channel: Option<&'a str>,
}

impl<'a> RoutingKey<'a> {
    pub fn new(tenant: &'a str, channel: Option<&'a str>) -> Self {
        RoutingKey { tenant, channel }
    }

    /// FNV state after the whole key.
    #[inline]
    pub fn fnv(&self) -> Fnv1a32 {
        let mut h = Fnv1a32::new();
        h.write_str(self.tenant);
        if let Some(channel) = self.channel {
            h.write_str(":");
            h.write_str(channel);
        }
        h
    }

    /// Appends the key's bytes (UTF-8) to `out`.
    pub fn write_to(&self, out: &mut impl Extend<u8>) {
        out.extend(self.tenant.bytes());
        if let Some(channel) = self.channel {
            out.extend(*b":");
            out.extend(channel.bytes());
        }
    }

    /// The key as one string (allocates only when a channel is present).
    pub fn to_joined(&self) -> std::borrow::Cow<'a, str> {
        match self.channel {
            None => std::borrow::Cow::Borrowed(self.tenant),
            Some(channel) => std::borrow::Cow::Owned(format!("{}:{}", self.tenant, channel)),
        }
    }
}

impl fmt::Display for RoutingKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.tenant)?;
        if let Some(channel) = self.channel {
            write!(f, ":{channel}")?;
        }
        Ok(())
    }
}

/// The reference's 64-bit jump key: `FNV(key) | FNV(key + "#hi") << 32`.
#[inline]
pub fn jump_key(key: &RoutingKey<'_>) -> u64 {
    let lo = key.fnv();
    let mut hi = lo;
    hi.write_str("#hi");
    u64::from(lo.finish()) | (u64::from(hi.finish()) << 32)
}

/// Lamping–Veach jump consistent hash with the reference's integer division
/// `((b + 1) << 31) / ((k >> 33) + 1)`. Returns a bucket in `[0, n)`, or
/// `None` when `n` is 0.
#[inline]
pub fn jump_hash(mut key: u64, buckets: usize) -> Option<usize> {
    let n = buckets as u64;
    if n == 0 {
        return None;
    }
    let mut b: u64 = 0;
    let mut j: u64 = 0;
    while j < n {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        // (b + 1) · 2^31 fits in u64 for any b < 2^32.
        j = ((b + 1) << 31) / ((key >> 33) + 1);
    }
    Some(b as usize)
}

/// `Math.max(load, 0.0001)` as JavaScript evaluates it (NaN stays NaN).
#[inline]
pub fn clamp_load(load: f64) -> f64 {
    if load.is_nan() {
        f64::NAN
    } else if load > 0.0001 {
        load
    } else {
        0.0001
    }
}

const TWO_POW_32: f64 = 4_294_967_296.0;

/// The reference's rendezvous score for one candidate:
/// `effective · −ln((seed + 1) / 2^32)`.
#[inline]
pub fn rendezvous_score(seed: u32, effective_weight: f64) -> f64 {
    let u = (f64::from(seed) + 1.0) / TWO_POW_32;
    effective_weight * -u.ln()
}

/// Seed of `key + "|" + id`, continuing from the key's FNV state.
#[inline]
pub fn rendezvous_seed(key_state: Fnv1a32, shard_id: &str) -> u32 {
    let mut h = key_state;
    h.write_str("|");
    h.write_str(shard_id);
    h.finish()
}

/// A rendezvous contestant: its id and its effective weight
/// (`weight / max(load, 0.0001)`), or `None` when its weight is ≤ 0 (skipped).
pub struct Contestant<'a> {
    pub id: &'a str,
    pub effective_weight: Option<f64>,
}

/// The reference's weighted rendezvous: the strictly highest score wins, ties
/// and NaN keep the earlier candidate, and index 0 wins when every candidate
/// is skipped.
pub fn rendezvous_pick<'a>(
    key: &RoutingKey<'_>,
    contestants: impl IntoIterator<Item = Contestant<'a>>,
) -> usize {
    let key_state = key.fnv();
    let mut best = 0;
    let mut best_score = f64::NEG_INFINITY;
    for (i, c) in contestants.into_iter().enumerate() {
        let Some(effective) = c.effective_weight else {
            continue;
        };
        let score = rendezvous_score(rendezvous_seed(key_state, c.id), effective);
        if score > best_score {
            best_score = score;
            best = i;
        }
    }
    best
}

/// Stable 64-bit hash of a routing key for `hrw` (XXH3 of its UTF-8 bytes).
#[inline]
pub fn hrw_key_hash(key: &RoutingKey<'_>) -> u64 {
    let mut buf: smallvec::SmallVec<[u8; 128]> = smallvec::SmallVec::new();
    key.write_to(&mut buf);
    xxhash_rust::xxh3::xxh3_64(&buf)
}

/// Stable 64-bit hash of a shard id for `hrw`, computed once per shard.
pub fn hrw_shard_hash(id: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(id.as_bytes(), 0x5348_4152_4447_4154)
}

/// Murmur3's 64-bit finaliser: a bijection that spreads every input bit.
#[inline]
fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// Textbook weighted rendezvous score `−w / ln u`, `u` uniform in (0, 1)
/// from the pair's mixed hash: a shard's expected share is its weight share.
#[inline]
pub fn hrw_score(key_hash: u64, shard_hash: u64, effective_weight: f64) -> f64 {
    let mixed = fmix64(key_hash ^ fmix64(shard_hash));
    // 53 high bits, centred in their cell: never 0, never 1.
    let u = ((mixed >> 11) as f64 + 0.5) * (1.0 / 9_007_199_254_740_992.0);
    -effective_weight / u.ln()
}

/// A user-supplied sticky strategy: `(key, candidates) → index`. The index is
/// clamped into range (negative → first, too large → last), as the
/// reference does.
pub trait CustomHash: Send + Sync {
    fn pick(&self, key: &str, candidates: &[&crate::routing::Shard]) -> i64;
}

impl<F> CustomHash for F
where
    F: Fn(&str, &[&crate::routing::Shard]) -> i64 + Send + Sync,
{
    fn pick(&self, key: &str, candidates: &[&crate::routing::Shard]) -> i64 {
        self(key, candidates)
    }
}

/// Clamp a strategy's index into `[0, len)`.
#[inline]
pub fn clamp_index(index: i64, len: usize) -> usize {
    if index <= 0 || len == 0 {
        0
    } else {
        (index as u64).min(len as u64 - 1) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_reference_values() {
        assert_eq!(fnv1a32(""), 2166136261);
        assert_eq!(fnv1a32("a"), 3826002220);
        assert_eq!(fnv1a32("acme"), 1174237615);
        assert_eq!(fnv1a32("acme#hi"), 999459575);
        assert_eq!(fnv1a32("é"), 1812687940);
        assert_eq!(fnv1a32("😀"), 3409036472);
    }

    #[test]
    fn streaming_key_equals_joined_key() {
        let key = RoutingKey::new("acme", Some("room-7"));
        assert_eq!(key.fnv().finish(), fnv1a32("acme:room-7"));
        assert_eq!(key.fnv().finish(), 3716541080);
        assert_eq!(
            RoutingKey::new("acme", Some("")).fnv().finish(),
            fnv1a32("acme:")
        );
    }

    #[test]
    fn jump_key_and_buckets_match_reference() {
        let acme = RoutingKey::new("acme", None);
        assert_eq!(jump_key(&acme), 4292646189473296815);
        let picks: Vec<usize> = [1, 2, 3, 4, 5, 8, 10, 100]
            .iter()
            .map(|&n| jump_hash(jump_key(&acme), n).unwrap())
            .collect();
        assert_eq!(picks, vec![0, 1, 1, 1, 1, 6, 6, 92]);
        assert_eq!(jump_hash(1, 0), None);
    }

    #[test]
    fn clamp_index_maps_out_of_range_to_the_ends() {
        assert_eq!(clamp_index(-5, 3), 0);
        assert_eq!(clamp_index(1, 3), 1);
        assert_eq!(clamp_index(99, 3), 2);
    }

    #[test]
    fn clamp_load_keeps_javascript_nan() {
        assert!(clamp_load(f64::NAN).is_nan());
        assert_eq!(clamp_load(-3.0), 0.0001);
        assert_eq!(clamp_load(2.0), 2.0);
    }
}
