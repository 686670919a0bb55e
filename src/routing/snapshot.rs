//! The router's snapshot: the reference's shape (version 1) with snake_case
//! names, and one deliberate fix: an unlimited bucket's `+∞` tokens are
//! written as the string `"Infinity"` (and `null` — what the reference's JSON
//! turns ∞ into — reads back as ∞), so unlimited stays unlimited.

use super::shard::Shard;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A token count that may be infinite.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tokens(pub f64);

impl Serialize for Tokens {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0.is_finite() {
            s.serialize_f64(self.0)
        } else if self.0 > 0.0 {
            s.serialize_str("Infinity")
        } else {
            // −∞ and NaN cannot come from the bucket arithmetic; an empty
            // bucket is the safe reading.
            s.serialize_f64(0.0)
        }
    }
}

impl<'de> Deserialize<'de> for Tokens {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(f64),
            Text(String),
            Null(()),
        }
        match Raw::deserialize(d)? {
            Raw::Number(n) => Ok(Tokens(n)),
            Raw::Null(()) => Ok(Tokens(f64::INFINITY)),
            Raw::Text(t) if t == "Infinity" => Ok(Tokens(f64::INFINITY)),
            Raw::Text(t) => Err(serde::de::Error::custom(format!(
                "tokens must be a number or \"Infinity\", got \"{t}\""
            ))),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSnapshot {
    pub active: u64,
    pub last_refill_at: f64,
    pub tenant: String,
    pub tokens: Tokens,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteBucketSnapshot {
    pub last_refill_at: f64,
    pub route: String,
    pub tenant: String,
    pub tokens: Tokens,
}

/// A client's bucket within its tenant (`per_client`); only in a
/// snapshot that has one not yet refilled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientBucketSnapshot {
    /// `203.0.113.7`, or `2001:db8:1:2::/64`.
    pub client: String,
    pub last_refill_at: f64,
    pub tenant: String,
    pub tokens: Tokens,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardSnapshot {
    #[serde(flatten)]
    pub shard: Shard,
    /// This shard's own tagged admissions.
    pub active: i64,
    pub draining: bool,
    pub healthy: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterSnapshot {
    pub at: f64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_buckets: Vec<ClientBucketSnapshot>,
    pub route_buckets: Vec<RouteBucketSnapshot>,
    pub shards: Vec<ShardSnapshot>,
    pub tenants: Vec<TenantSnapshot>,
    pub version: u32,
}

impl RouterSnapshot {
    /// Moves every timestamp by `delta_ms` (clock domain ↔ wall clock).
    pub fn shift_time(&mut self, delta_ms: f64) {
        self.at += delta_ms;
        for t in &mut self.tenants {
            t.last_refill_at += delta_ms;
        }
        for r in &mut self.route_buckets {
            r.last_refill_at += delta_ms;
        }
        for c in &mut self.client_buckets {
            c.last_refill_at += delta_ms;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infinity_survives_json_and_null_reads_as_infinity() {
        let json = serde_json::to_string(&Tokens(f64::INFINITY)).unwrap();
        assert_eq!(json, "\"Infinity\"");
        let back: Tokens = serde_json::from_str(&json).unwrap();
        assert!(back.0.is_infinite());
        let from_reference: Tokens = serde_json::from_str("null").unwrap();
        assert!(from_reference.0.is_infinite());
        let plain: Tokens = serde_json::from_str("2.75").unwrap();
        assert_eq!(plain.0, 2.75);
        assert!(serde_json::from_str::<Tokens>("\"lots\"").is_err());
    }
}
