//! Placement hashes. `fnv1a32`, `jump` and `rendezvous` reproduce
//! `@absolutejs/router` bit for bit (UTF-16 code units, integer jump
//! division, `w·(−ln u)` with strict `>`), so tenants migrating from it do not
//! move. `hrw` is the well-spread weighted rendezvous we recommend instead.

use smallvec::SmallVec;
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

/// `−ln(k / 4096)` for k in 0..=4096 (`+∞` at 0): brackets `−ln u` for any
/// `u` in `[k/4096, (k+1)/4096]` between entries `k + 1` and `k`.
static NEG_LN_SLICES: std::sync::LazyLock<Box<[f64]>> = std::sync::LazyLock::new(|| {
    (0..=4096)
        .map(|k| {
            if k == 0 {
                f64::INFINITY
            } else if k == 4096 {
                0.0 // not −0.0: `w / 0.0` must be +∞
            } else {
                -(f64::from(k) / 4096.0).ln()
            }
        })
        .collect()
});

/// Relative slack added to the bracket bounds: covers the few ulps by which
/// the table entries and the products may be off.
const BRACKET_SLACK: f64 = 1e-12;

/// Bounds `[lo, hi]` that certainly contain a score; `(−∞, +∞)` when the
/// weight is not a plain positive finite number (the exact score decides).
#[inline]
fn usable(effective: f64) -> bool {
    effective > 0.0 && effective < 1e300
}

/// Picks the candidate with the strictly highest exact score, ties and NaN
/// keeping the earlier one, index 0 when none scores. Each candidate comes
/// with bounds on its score; only those whose upper bound reaches the best
/// lower bound get their exact score computed (one or two of 64, typically),
/// which gives the same answer as scoring everyone.
#[inline]
fn argmax_bracketed<T: Copy>(
    items: &[(usize, T, f64, f64)],
    best_lo: f64,
    exact: impl Fn(T) -> f64,
) -> usize {
    let mut best = 0;
    let mut best_score = f64::NEG_INFINITY;
    for &(i, payload, _lo, hi) in items {
        if hi < best_lo {
            continue;
        }
        let score = exact(payload);
        if score > best_score {
            best = i;
            best_score = score;
        }
    }
    best
}

type Scored<T> = SmallVec<[(usize, T, f64, f64); 64]>;

/// The reference's weighted rendezvous: the strictly highest
/// `effective · −ln u` wins, ties and NaN keep the earlier candidate, and
/// index 0 wins when every candidate is skipped. Bit-identical to scoring
/// every candidate with `ln` (see `argmax_bracketed`).
pub fn rendezvous_pick<'a>(
    key: &RoutingKey<'_>,
    contestants: impl IntoIterator<Item = Contestant<'a>>,
) -> usize {
    let key_state = key.fnv();
    let slices = &**NEG_LN_SLICES;
    let mut items: Scored<(u32, f64)> = SmallVec::new();
    let mut best_lo = f64::NEG_INFINITY;
    for (i, c) in contestants.into_iter().enumerate() {
        let Some(effective) = c.effective_weight else {
            continue;
        };
        let seed = rendezvous_seed(key_state, c.id);
        let (lo, hi) = if usable(effective) {
            // u = (seed + 1) / 2^32 lies in slice k = floor(u · 4096).
            let k = (((u64::from(seed) + 1) << 12) >> 32).min(4095) as usize;
            (
                effective * slices[k + 1] * (1.0 - BRACKET_SLACK),
                effective * slices[k] * (1.0 + BRACKET_SLACK),
            )
        } else {
            (f64::NEG_INFINITY, f64::INFINITY)
        };
        best_lo = best_lo.max(lo);
        items.push((i, (seed, effective), lo, hi));
    }
    argmax_bracketed(&items, best_lo, |(seed, effective)| {
        rendezvous_score(seed, effective)
    })
}

/// Stable 64-bit hash of a routing key for `hrw` (XXH3 of its UTF-8 bytes).
#[inline]
pub fn hrw_key_hash(key: &RoutingKey<'_>) -> u64 {
    let mut buf: SmallVec<[u8; 128]> = SmallVec::new();
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

#[inline]
fn hrw_mix(key_hash: u64, shard_hash: u64) -> u64 {
    fmix64(key_hash ^ fmix64(shard_hash))
}

/// `u` uniform in (0, 1) from the 53 high bits, centred in their cell.
#[inline]
fn hrw_unit(mixed: u64) -> f64 {
    ((mixed >> 11) as f64 + 0.5) * (1.0 / 9_007_199_254_740_992.0)
}

/// Textbook weighted rendezvous score `−w / ln u`, `u` uniform in (0, 1)
/// from the pair's mixed hash: a shard's expected share is its weight share.
#[inline]
pub fn hrw_score(key_hash: u64, shard_hash: u64, effective_weight: f64) -> f64 {
    -effective_weight / hrw_unit(hrw_mix(key_hash, shard_hash)).ln()
}

/// The `hrw` pick over `(shard hash, effective weight)` candidates (`None`
/// weight = skipped): the strictly highest [`hrw_score`], ties keeping the
/// earlier, index 0 when none scores.
pub fn hrw_pick(
    key: &RoutingKey<'_>,
    candidates: impl IntoIterator<Item = (u64, Option<f64>)>,
) -> usize {
    let key_hash = hrw_key_hash(key);
    let slices = &**NEG_LN_SLICES;
    let mut items: Scored<(u64, f64)> = SmallVec::new();
    let mut best_lo = f64::NEG_INFINITY;
    for (i, (shard_hash, effective)) in candidates.into_iter().enumerate() {
        let Some(effective) = effective else {
            continue;
        };
        let mixed = hrw_mix(key_hash, shard_hash);
        let (lo, hi) = if usable(effective) {
            // u lies in slice k = floor(u · 4096) = the 12 high bits; the
            // score w / (−ln u) grows with u.
            let k = (mixed >> 52) as usize;
            (
                effective / slices[k] * (1.0 - BRACKET_SLACK),
                effective / slices[k + 1] * (1.0 + BRACKET_SLACK),
            )
        } else {
            (f64::NEG_INFINITY, f64::INFINITY)
        };
        best_lo = best_lo.max(lo);
        items.push((i, (mixed, effective), lo, hi));
    }
    argmax_bracketed(&items, best_lo, |(mixed, effective)| {
        -effective / hrw_unit(mixed).ln()
    })
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

    /// Scores every candidate: the definition the shortlists must match.
    fn rendezvous_naive(key: &RoutingKey<'_>, c: &[(String, Option<f64>)]) -> usize {
        let state = key.fnv();
        let (mut best, mut best_score) = (0, f64::NEG_INFINITY);
        for (i, (id, w)) in c.iter().enumerate() {
            if let Some(w) = w {
                let score = rendezvous_score(rendezvous_seed(state, id), *w);
                if score > best_score {
                    best = i;
                    best_score = score;
                }
            }
        }
        best
    }

    fn hrw_naive(key: &RoutingKey<'_>, c: &[(u64, Option<f64>)]) -> usize {
        let kh = hrw_key_hash(key);
        let (mut best, mut best_score) = (0, f64::NEG_INFINITY);
        for (i, (h, w)) in c.iter().enumerate() {
            if let Some(w) = w {
                let score = hrw_score(kh, *h, *w);
                if score > best_score {
                    best = i;
                    best_score = score;
                }
            }
        }
        best
    }

    #[test]
    fn shortlisted_picks_equal_scoring_everyone() {
        let weights = [
            1.0,
            2.0,
            0.5,
            1e-300,
            1e-4,
            3.0,
            1e4,
            f64::NAN,
            f64::INFINITY,
            1e305,
        ];
        let mut x: u64 = 0x1234_5678_9abc_def1;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..4000 {
            let n = 1 + (next() % 70) as usize;
            let c: Vec<(String, Option<f64>)> = (0..n)
                .map(|i| {
                    let r = next();
                    let w = match round % 4 {
                        0 => Some(1.0),
                        1 => Some(weights[(r % 7) as usize]),
                        2 => (r % 5 != 0).then(|| weights[(r % 10) as usize]),
                        _ => Some(1.0 + (r % 1000) as f64 / 1000.0),
                    };
                    (format!("shard-{i}-{}", r % 3), w)
                })
                .collect();
            let tenant = format!("t{}", next() % 100_000);
            let key = RoutingKey::new(&tenant, None);
            let fast = rendezvous_pick(
                &key,
                c.iter().map(|(id, w)| Contestant {
                    id,
                    effective_weight: *w,
                }),
            );
            assert_eq!(fast, rendezvous_naive(&key, &c), "{tenant} {c:?}");
            let h: Vec<(u64, Option<f64>)> =
                c.iter().map(|(id, w)| (hrw_shard_hash(id), *w)).collect();
            assert_eq!(
                hrw_pick(&key, h.iter().copied()),
                hrw_naive(&key, &h),
                "{tenant}"
            );
        }
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
