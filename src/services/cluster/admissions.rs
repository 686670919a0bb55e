//! Connection caps across the cluster: each node writes its live
//! admissions per capped tenant to its own hash and reads every other live
//! node's, whose sum the cap check adds to its own count.

use super::service::Syncer;
use crate::cluster::conn::{text_pairs, Raw};
use crate::cluster::NODE_TTL_MS;
use compact_str::CompactString;
use std::collections::HashMap;

impl Syncer {
    /// Writes this node's admissions per capped tenant (changes only) and
    /// reads every other live node's.
    pub(super) async fn share_admissions(&mut self) {
        let me = self.shared().node_id().to_string();
        let changes = self.admission_changes();
        if !changes.is_empty() {
            self.write_admissions(&me, changes).await;
        }
        if let Some(others) = self.read_others_admissions(&me).await {
            self.shared().set_others(others);
        }
    }

    /// What changed since the last write: tracked tenants whose count
    /// moved, and written ones no longer tracked (to 0).
    fn admission_changes(&self) -> Vec<(CompactString, u64)> {
        let router = &self.control.router;
        let mut changes: Vec<(CompactString, u64)> = Vec::new();
        for tenant in self.tracked.keys() {
            let active = router.tenant_active(tenant);
            if self.caps_written.get(tenant).copied().unwrap_or(0) != active {
                changes.push((tenant.clone(), active));
            }
        }
        for (tenant, n) in &self.caps_written {
            if *n > 0 && !self.tracked.contains_key(tenant) {
                changes.push((tenant.clone(), 0));
            }
        }
        changes
    }

    /// Writes the changes to this node's hash (a count of 0 removes the
    /// tenant), keeps the hash alive for a node's TTL, and remembers them
    /// as written once Redis took them all.
    async fn write_admissions(&mut self, me: &str, changes: Vec<(CompactString, u64)>) {
        let key = self.caps_key(me);
        let mut set = redis::cmd("HSET");
        set.arg(&key);
        let mut del = redis::cmd("HDEL");
        del.arg(&key);
        let (mut sets, mut dels) = (0, 0);
        for (tenant, n) in &changes {
            if *n > 0 {
                set.arg(tenant.as_str()).arg(*n);
                sets += 1;
            } else {
                del.arg(tenant.as_str());
                dels += 1;
            }
        }
        let ok_set = sets == 0 || self.query::<i64>("caps", &set).await.is_some();
        let ok_del = dels == 0 || self.query::<i64>("caps", &del).await.is_some();
        let expire = redis::cmd("PEXPIRE").arg(&key).arg(NODE_TTL_MS).to_owned();
        let _ = self.query::<i64>("caps", &expire).await;
        if ok_set && ok_del {
            for (tenant, n) in changes {
                if n > 0 {
                    self.caps_written.insert(tenant, n);
                } else {
                    self.caps_written.remove(&tenant);
                }
            }
        }
    }

    /// Every other live node's admissions per tenant, summed; `None` once
    /// Redis cannot be reached (the last sums stay).
    async fn read_others_admissions(&mut self, me: &str) -> Option<HashMap<CompactString, u64>> {
        let mut others: HashMap<CompactString, u64> = HashMap::new();
        for node in self.shared().alive_ids().iter() {
            if *node == me {
                continue;
            }
            let read = redis::cmd("HGETALL").arg(self.caps_key(node)).to_owned();
            let Some(theirs) = self.query::<Raw>("caps", &read).await else {
                if self.link.connected() {
                    // This node's hash is damaged: the others still count.
                    continue;
                }
                return None;
            };
            for (tenant, n) in text_pairs(theirs) {
                // A count no node wrote is skipped; a sum stays far from
                // overflowing what a cap check adds to it.
                let Ok(n) = n.parse::<u64>() else {
                    continue;
                };
                let sum = others.entry(CompactString::from(tenant)).or_insert(0);
                *sum = sum.saturating_add(n).min(u64::from(u32::MAX));
            }
        }
        Some(others)
    }
}
