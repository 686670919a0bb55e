//! Region assignments in cluster mode. Each node publishes its region list
//! (`{state}:lists`). While the alive nodes' lists agree, every node
//! computes the same default pick for a tenant, and nothing per tenant is
//! written: an invented name costs Redis nothing. While they differ (a
//! rolling change of the regions), an assignment that some node would pick
//! differently is offered in `{state}:regions` (the first one wins; at most
//! `limits.max_tracked_tenants` entries) and logged in `{state}:assigned`
//! for the others to adopt. Once the lists agree again, entries equal to
//! the common pick are pruned, here and in Redis.

use super::service::Syncer;
use crate::cluster::conn::{text_pairs, Raw};
use crate::cluster::Peers;
use crate::routing::region::RegionList;
use crate::routing::RegionDirectory;
use compact_str::CompactString;
use redis::Script;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the nodes' lists are exchanged.
const LISTS_EVERY: Duration = Duration::from_secs(1);
/// A full pass of pruning starts at most this often.
const PRUNE_EVERY: Duration = Duration::from_secs(30);
/// Offers in flight at once, and entries read per pruning step.
const BATCH: usize = 256;
/// Entries the log keeps (nodes that fall further behind reload the hash).
const LOG_LENGTH: usize = 100_000;

/// Offers ARGV[2] as tenant ARGV[1]'s region in the hash KEYS[1] unless it
/// has one or the hash holds ARGV[3] entries; logs a new entry in the
/// stream KEYS[2]. Returns `{0, region}` (another node was first), `{1,
/// region}` (this one) or `{2, region}` (the hash is full: nothing kept).
const OFFER_LUA: &str = r"
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current then return {0, current} end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return {2, ARGV[2]} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', ARGV[1], ARGV[2])
return {1, ARGV[2]}
";

pub(super) struct RegionSync {
    /// The last entry of the assignment log read.
    log_at: String,
    lists_at: Option<Instant>,
    /// Where the pruning scan is (`None`: not scanning), and when the last
    /// scan started.
    prune_cursor: Option<u64>,
    pruned_at: Option<Instant>,
    offer: Script,
}

impl Default for RegionSync {
    fn default() -> Self {
        RegionSync {
            log_at: "0-0".to_string(),
            lists_at: None,
            prune_cursor: None,
            pruned_at: None,
            offer: Script::new(OFFER_LUA),
        }
    }
}

/// A list as published: `[[id, weight], …]` in the registered order.
fn encode(list: &RegionList) -> String {
    let pairs: Vec<(&str, f64)> = list.iter().map(|(id, w)| (&**id, *w)).collect();
    serde_json::to_string(&pairs).unwrap_or_default()
}

/// Another node's list as read from Redis; `None` if it is not one (an
/// empty list is none either: no region can be picked from it).
fn decode(text: &str) -> Option<RegionList> {
    let pairs: Vec<(String, f64)> = serde_json::from_str(text).ok()?;
    if pairs.is_empty() {
        return None;
    }
    Some(
        pairs
            .into_iter()
            .map(|(id, w)| (Arc::from(id.as_str()), w))
            .collect(),
    )
}

impl Syncer {
    /// One step of the region sync; `fresh` after a (re)connection loads
    /// the shared assignments whole. `false` when Redis failed.
    pub(super) async fn sync_regions(&mut self, fresh: bool) -> bool {
        let control = Arc::clone(&self.control);
        let Some(directory) = &control.regions else {
            return true;
        };
        let hash = self.key("{state}:regions");
        let log = self.key("{state}:assigned");
        if fresh {
            let last = redis::cmd("XREVRANGE")
                .arg(&log)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1)
                .to_owned();
            let Some(entries) = self
                .query::<Vec<(String, Vec<String>)>>("regions", &last)
                .await
            else {
                return false;
            };
            self.regions.log_at = entries
                .into_iter()
                .next()
                .map_or_else(|| "0-0".to_string(), |(id, _)| id);
            // A step at a time: the hash may hold up to the bound.
            let bound = self.control.config.limits.max_tracked_tenants;
            let mut all: HashMap<CompactString, String> = HashMap::new();
            let mut cursor = 0u64;
            loop {
                let Some((next, entries)) = self.scan_assignments(&hash, cursor).await else {
                    return false;
                };
                for (t, r) in entries.into_iter().take(bound.saturating_sub(all.len())) {
                    all.insert(CompactString::from(t), r);
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
            self.shared().set_regions(all);
            self.regions.lists_at = None;
        }
        if self
            .regions
            .lists_at
            .is_none_or(|at| at.elapsed() >= LISTS_EVERY)
        {
            if !self.exchange_lists(&directory.list()).await {
                return false;
            }
            self.regions.lists_at = Some(Instant::now());
        }
        self.offer_assignments(directory, &hash, &log).await;
        self.read_assignments(directory, &log).await;
        if self.shared().regions_agree() {
            self.prune_assignments(&directory.list(), &hash, &log).await;
        }
        true
    }

    /// Publishes this node's list and reads the alive nodes' lists. Lists
    /// of nodes gone from the nodes set are removed.
    async fn exchange_lists(&mut self, mine: &RegionList) -> bool {
        let key = self.key("{state}:lists");
        let me = self.shared().node_id().to_string();
        let encoded = encode(mine);
        let put = redis::cmd("HSET")
            .arg(&key)
            .arg(&me)
            .arg(&encoded)
            .to_owned();
        if self.query::<i64>("regions", &put).await.is_none() {
            return false;
        }
        let read = redis::cmd("HGETALL").arg(&key).to_owned();
        let Some(lists) = self.query::<Raw>("regions", &read).await else {
            return false;
        };
        let lists: HashMap<String, String> = text_pairs(lists).collect();
        let alive = self.shared().alive_ids();
        let mut peers = Peers {
            unknown: false,
            lists: Vec::new(),
            known: alive.to_vec(),
        };
        for node in alive.iter().filter(|n| **n != me) {
            match lists.get(node.as_str()) {
                Some(theirs) if *theirs == encoded => {}
                Some(theirs) => match decode(theirs) {
                    Some(list) if !peers.lists.contains(&list) => peers.lists.push(list),
                    Some(_) => {}
                    None => {
                        // As if not read: every assignment is offered.
                        self.shared().sync_error(
                            "regions",
                            &format_args!("the region list of node `{node}` is not one; skipped"),
                        );
                        peers.unknown = true;
                    }
                },
                None => peers.unknown = true,
            }
        }
        // Agreement reached again: the pruning starts over at once.
        let agreed = self.shared().regions_agree();
        self.shared().peers.store(Arc::new(peers));
        if self.shared().regions_agree() && !agreed {
            self.regions.pruned_at = None;
        }
        let nodes = self.shared().nodes();
        if nodes.is_empty() {
            return true;
        }
        let present: HashSet<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
        let gone: Vec<&String> = lists
            .keys()
            .filter(|n| **n != me && !present.contains(n.as_str()))
            .collect();
        if !gone.is_empty() {
            let del = redis::cmd("HDEL").arg(&key).arg(gone).to_owned();
            let _ = self.query::<i64>("regions", &del).await;
        }
        true
    }

    /// Offers this node's new assignments that another alive node would
    /// pick differently (first one wins); where another node was first, its
    /// region is adopted.
    async fn offer_assignments(&mut self, directory: &RegionDirectory, hash: &str, log: &str) {
        let peers = self.shared().peers.load_full();
        let unknown = self.shared().region_lists_unknown();
        let cap = self.control.config.limits.max_tracked_tenants;
        // Explained tenants reach here too (the hook runs on a peek): only
        // an assignment the directory holds is offered.
        let offers: Vec<(CompactString, String)> = (self.shared().take_assigned().into_iter())
            .filter_map(|tenant| {
                let mine = directory.assigned_region(&tenant)?;
                let differs = unknown
                    || (peers.lists.iter())
                        .any(|list| *RegionDirectory::default_pick(list, &tenant) != *mine);
                differs.then_some((tenant, mine))
            })
            .collect();
        let offer = &self.regions.offer;
        let answers = (self.link)
            .each("regions", &offers, |(tenant, mine), mut conn| {
                let mut invocation = offer.key(hash);
                invocation
                    .key(log)
                    .arg(tenant.as_str())
                    .arg(mine)
                    .arg(cap)
                    .arg(LOG_LENGTH);
                async move { invocation.invoke_async::<(i64, String)>(&mut conn).await }
            })
            .await;
        for ((tenant, mine), answer) in offers.iter().zip(answers) {
            match answer {
                // The hash is full: this node keeps its own pick.
                Some((2, _)) => {}
                Some((_, region)) => {
                    if region != *mine {
                        directory.adopt(tenant, &region);
                    }
                    self.shared().add_region_entry(tenant, &region);
                }
                // Offered again at the next pass.
                None => self.shared().assigned(tenant),
            }
        }
    }

    /// Reads the assignments other nodes made since the last read, so a
    /// tenant's first request here already takes the shared region.
    async fn read_assignments(&mut self, directory: &RegionDirectory, log: &str) {
        loop {
            let read = redis::cmd("XRANGE")
                .arg(log)
                .arg(format!("({}", self.regions.log_at))
                .arg("+")
                .arg("COUNT")
                .arg(1000)
                .to_owned();
            let Some(entries) = self.query::<Vec<(String, Raw)>>("regions", &read).await else {
                return;
            };
            let more = entries.len() == 1000;
            for (id, fields) in entries {
                for (tenant, region) in text_pairs(fields) {
                    self.shared().add_region_entry(&tenant, &region);
                    directory.adopt(&tenant, &region);
                }
                self.regions.log_at = id;
            }
            if !more {
                return;
            }
        }
    }

    /// Every node agrees: shared entries equal to the common pick, or
    /// naming a region no node has any more, are forgotten, here at once
    /// and in Redis a step at a time; once a pass is done the log is
    /// emptied (no node needs it while they agree).
    async fn prune_assignments(&mut self, list: &RegionList, hash: &str, log: &str) {
        let needless = |t: &str, r: &str| {
            !list.iter().any(|(id, _)| **id == *r) || *RegionDirectory::default_pick(list, t) == *r
        };
        let cursor = match (self.regions.prune_cursor, self.regions.pruned_at) {
            (Some(cursor), _) => cursor,
            (None, Some(at)) if at.elapsed() < PRUNE_EVERY => return,
            (None, _) => {
                self.regions.pruned_at = Some(Instant::now());
                self.shared().retain_regions(|t, r| !needless(t, r));
                0
            }
        };
        let Some((next, entries)) = self.scan_assignments(hash, cursor).await else {
            return;
        };
        self.regions.prune_cursor = (next != 0).then_some(next);
        let common: Vec<&String> = entries
            .iter()
            .filter(|(t, r)| needless(t, r))
            .map(|(t, _)| t)
            .collect();
        if !common.is_empty() {
            let del = redis::cmd("HDEL").arg(hash).arg(common).to_owned();
            let _ = self.query::<i64>("regions", &del).await;
        }
        if next == 0 {
            let trim = redis::cmd("XTRIM").arg(log).arg("MAXLEN").arg(0).to_owned();
            let _ = self.query::<i64>("regions", &trim).await;
        }
    }

    /// One step of a scan of the shared assignments: the next cursor (0 at
    /// the end) and the entries.
    async fn scan_assignments(
        &mut self,
        hash: &str,
        cursor: u64,
    ) -> Option<(u64, Vec<(String, String)>)> {
        let scan = redis::cmd("HSCAN")
            .arg(hash)
            .arg(cursor)
            .arg("COUNT")
            .arg(BATCH)
            .to_owned();
        let (next, entries) = self.query::<(u64, Raw)>("regions", &scan).await?;
        Some((next, text_pairs(entries).collect()))
    }

    /// Shutdown: this node's list goes with it.
    pub(super) async fn leave_regions(&mut self) {
        if self.control.regions.is_none() {
            return;
        }
        let del = redis::cmd("HDEL")
            .arg(self.key("{state}:lists"))
            .arg(self.shared().node_id())
            .to_owned();
        let _ = self.query::<i64>("leave", &del).await;
    }
}
