//! The tenants refused most right now (`GET /v1/tenants/top?by=refused`):
//! heavy hitters over a sliding window, in bounded memory whatever the
//! number of tenants.
//!
//! The window is [`SLOTS`] slots of [`SLOT_MS`]; each slot is a
//! Space-Saving summary (Metwally et al., 2005) of at most [`CAPACITY`]
//! tenants. A tenant already counted in the slot is incremented; a new one
//! takes a free entry, or when the slot is full replaces the entry with
//! the smallest count and inherits that count (its `error`): counts are
//! never under-estimated, and any tenant refused more than
//! `slot total / CAPACITY` times in a slot is in it. A query adds the slots
//! of the window up: for a slot that does not hold a tenant, that tenant
//! may have been refused up to the slot's smallest count there, which is
//! added to its `error`. Memory: `SLOTS × CAPACITY` entries, each a tenant
//! id and four counters. Refusals only: an admitted request never comes
//! here.

use super::Decision;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::HashMap;

/// Tenants each slot tracks.
pub const CAPACITY: usize = 64;
/// Length of one slot.
pub const SLOT_MS: u64 = 10_000;
/// Slots in the window: the window covers the last 50–60 s.
pub const SLOTS: usize = 6;

#[derive(Clone, Debug)]
struct Entry {
    tenant: Box<str>,
    /// Refusals counted (an over-estimate by at most `error`).
    count: u64,
    /// What the entry inherited when it took the place of another tenant.
    error: u64,
    rate_limited: u64,
    capped: u64,
}

#[derive(Default)]
struct Slot {
    /// `now / SLOT_MS` when the slot was last written; older means empty.
    epoch: u64,
    entries: Vec<Entry>,
    index: HashMap<Box<str>, usize>,
}

impl Slot {
    fn reset(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.entries.clear();
        self.index.clear();
    }

    fn record(&mut self, tenant: &str, decision: Decision) {
        let i = match self.index.get(tenant) {
            Some(&i) => i,
            None if self.entries.len() < CAPACITY => {
                self.entries.push(Entry {
                    tenant: tenant.into(),
                    count: 0,
                    error: 0,
                    rate_limited: 0,
                    capped: 0,
                });
                self.index.insert(tenant.into(), self.entries.len() - 1);
                self.entries.len() - 1
            }
            None => {
                let Some((i, _)) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.count)
                else {
                    return;
                };
                let e = &mut self.entries[i];
                self.index.remove(&e.tenant);
                *e = Entry {
                    tenant: tenant.into(),
                    count: e.count,
                    error: e.count,
                    rate_limited: 0,
                    capped: 0,
                };
                self.index.insert(tenant.into(), i);
                i
            }
        };
        let e = &mut self.entries[i];
        e.count += 1;
        match decision {
            Decision::Capped => e.capped += 1,
            _ => e.rate_limited += 1,
        }
    }

    /// What a tenant absent from this slot may have had here.
    fn floor(&self) -> u64 {
        if self.entries.len() < CAPACITY {
            0
        } else {
            self.entries.iter().map(|e| e.count).min().unwrap_or(0)
        }
    }
}

/// One tenant in a [`TopRefused::top`] answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TopTenant {
    pub tenant: String,
    /// Refusals in the window (rate-limited + capped), at most `error` too many.
    pub refused: u64,
    pub rate_limited: u64,
    pub capped: u64,
    /// How far `refused` may over-count (0: exact).
    pub error: u64,
}

/// Counts refusals (rate-limited, capped) per tenant over the last minute.
pub struct TopRefused {
    slots: Mutex<Vec<Slot>>,
}

impl Default for TopRefused {
    fn default() -> Self {
        TopRefused {
            slots: Mutex::new((0..SLOTS).map(|_| Slot::default()).collect()),
        }
    }
}

impl TopRefused {
    /// Counts one refusal of `tenant` at `now_ms`; other decisions are ignored.
    #[inline]
    pub fn record(&self, tenant: &str, decision: Decision, now_ms: f64) {
        if !matches!(decision, Decision::RateLimited | Decision::Capped) {
            return;
        }
        let epoch = epoch(now_ms);
        let mut slots = self.slots.lock();
        let slot = &mut slots[(epoch % SLOTS as u64) as usize];
        if slot.epoch != epoch {
            slot.reset(epoch);
        }
        slot.record(tenant, decision);
    }

    /// The `n` tenants refused most in the window ending at `now_ms`,
    /// ranked by the count each is sure to have (`refused - error`), so a
    /// flood of one-off tenants does not outrank one refused steadily.
    pub fn top(&self, n: usize, now_ms: f64) -> Vec<TopTenant> {
        let now = epoch(now_ms);
        // Copied out under the lock (at most SLOTS × CAPACITY entries) and
        // merged without it: refusals do not wait on a reader.
        let live: Vec<(Vec<Entry>, u64)> = {
            let slots = self.slots.lock();
            slots
                .iter()
                .filter(|s| s.epoch + SLOTS as u64 > now && s.epoch <= now && !s.entries.is_empty())
                .map(|s| (s.entries.clone(), s.floor()))
                .collect()
        };
        let mut merged: HashMap<&str, TopTenant> = HashMap::new();
        for (entries, _) in &live {
            for e in entries {
                let t = merged.entry(&e.tenant).or_insert_with(|| TopTenant {
                    tenant: e.tenant.to_string(),
                    refused: 0,
                    rate_limited: 0,
                    capped: 0,
                    error: 0,
                });
                t.refused += e.count;
                t.error += e.error;
                t.rate_limited += e.rate_limited;
                t.capped += e.capped;
            }
        }
        let mut out: Vec<TopTenant> = merged
            .into_values()
            .map(|mut t| {
                // A slot that does not list the tenant may still have had
                // up to its floor of it.
                let missed: u64 = live
                    .iter()
                    .filter(|(entries, _)| !entries.iter().any(|e| *e.tenant == *t.tenant))
                    .map(|(_, floor)| floor)
                    .sum();
                t.refused += missed;
                t.error += missed;
                t
            })
            .collect();
        out.sort_by(|a, b| {
            (b.refused - b.error)
                .cmp(&(a.refused - a.error))
                .then(b.refused.cmp(&a.refused))
                .then_with(|| a.tenant.cmp(&b.tenant))
        });
        out.truncate(n);
        out
    }
}

fn epoch(now_ms: f64) -> u64 {
    (now_ms.max(0.0) as u64) / SLOT_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refuse(top: &TopRefused, tenant: &str, times: usize, at: f64) {
        for _ in 0..times {
            top.record(tenant, Decision::RateLimited, at);
        }
    }

    #[test]
    fn counts_refusals_by_kind_and_ignores_the_rest() {
        let top = TopRefused::default();
        refuse(&top, "a", 3, 1_000.0);
        top.record("a", Decision::Capped, 1_000.0);
        top.record("b", Decision::Allow, 1_000.0);
        top.record("b", Decision::Denied, 1_000.0);
        assert_eq!(
            top.top(10, 1_000.0),
            vec![TopTenant {
                tenant: "a".into(),
                refused: 4,
                rate_limited: 3,
                capped: 1,
                error: 0
            }]
        );
    }

    #[test]
    fn the_window_slides() {
        let top = TopRefused::default();
        refuse(&top, "old", 5, 0.0);
        refuse(&top, "new", 2, 55_000.0);
        let names = |v: Vec<TopTenant>| v.into_iter().map(|t| t.tenant).collect::<Vec<_>>();
        assert_eq!(names(top.top(10, 55_000.0)), ["old", "new"]);
        // 60 s on, the first slot has left the window...
        assert_eq!(names(top.top(10, 60_000.0)), ["new"]);
        // ...and a write into its place starts it afresh.
        refuse(&top, "later", 1, 60_000.0);
        assert_eq!(names(top.top(10, 60_000.0)), ["new", "later"]);
        assert_eq!(top.top(10, 200_000.0), vec![]);
    }

    #[test]
    fn heavy_hitters_survive_a_flood_of_one_off_tenants_in_bounded_memory() {
        let top = TopRefused::default();
        for i in 0..100_000 {
            top.record(&format!("noise-{i}"), Decision::RateLimited, 1_000.0);
            if i % 10 == 0 {
                top.record("hot", Decision::RateLimited, 1_000.0);
            }
            if i % 50 == 0 {
                top.record("warm", Decision::Capped, 1_000.0);
            }
        }
        let got = top.top(2, 1_000.0);
        assert_eq!(got[0].tenant, "hot");
        assert_eq!(got[1].tenant, "warm");
        // Never under-counted; the over-count is bounded by `error`.
        assert!(got[0].refused >= 10_000 && got[0].refused - got[0].error <= 10_000);
        assert!(got[1].refused >= 2_000 && got[1].refused - got[1].error <= 2_000);
        let slots = top.slots.lock();
        assert!(slots
            .iter()
            .all(|s| s.entries.len() <= CAPACITY && s.index.len() <= CAPACITY));
    }

    #[test]
    fn a_tenant_missing_from_a_full_slot_carries_its_floor_as_error() {
        let top = TopRefused::default();
        for i in 0..CAPACITY {
            refuse(&top, &format!("t{i}"), 3, 1_000.0);
        }
        refuse(&top, "late", 1, 11_000.0);
        let late = top
            .top(CAPACITY + 1, 11_000.0)
            .into_iter()
            .find(|t| t.tenant == "late")
            .expect("late is listed");
        assert_eq!((late.refused, late.error), (4, 3));
    }
}
