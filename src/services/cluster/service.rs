//! The cluster service: the only code that talks to Redis. Every
//! `sync_interval` it settles the tenants that spent (their leases topped
//! up, their credit charged) and publishes this node's live admissions per
//! capped tenant while reading the others'; every 200 ms it exchanges
//! runtime state (`regions.rs` for the region assignments). The heartbeat
//! (`cluster/heartbeat.rs`) runs beside it on its own thread. Requests never wait on
//! it: while Redis is down they run on what the node last knew (DESIGN §4).

use crate::cluster::conn::{text_pairs, Raw};
use crate::cluster::heartbeat::Heartbeat;
use crate::cluster::link::Link;
use crate::cluster::{Shared, NODE_TTL_MS};
use crate::control::Control;
use crate::limits::{share_of, TenantState};
use compact_str::CompactString;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use redis::Script;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A tenant untouched this long gives its lease back.
const IDLE_RELEASE: Duration = Duration::from_secs(1);
const STATE_POLL: Duration = Duration::from_millis(200);
/// Settles one pass runs at most (two batches): what a flood of invented
/// names leaves out waits for the next pass, behind real tenants, and a
/// pass stays short even when Redis is slow.
const SETTLE_BUDGET: usize = 512;

/// Settles one tenant's buckets (a hash at KEYS[1]). For each bucket:
/// refill by Redis' clock, never past the capacity minus the other nodes'
/// leases; charge the credit this node spent outside the ledger; then
/// either take back this node's lease (release) or top it up to a fair
/// share of what is free and leased among the nodes that hold a lease.
/// Each lease carries the time of its last settle (`|a|` field). A lease
/// of a node not in the alive list, or not settled for 10 s (its node
/// forgot the tenant, or could not reach Redis), counts as spent: it stops
/// counting as leased, and the bucket refills into it. So when this node
/// finds its own lease, granted before (the bucket's 6th argument), gone,
/// what it still holds was counted spent: a release does not give it back,
/// a top-up charges it. Returns the grants (for a release: how full each
/// bucket is, as a fraction). A field (or key) some other writer damaged
/// reads as missing: no value in Redis stops a tenant's settles.
const SETTLE_LUA: &str = r"
local key, me, release = KEYS[1], ARGV[1], ARGV[2] == '1'
local alive = {}
for n in string.gmatch(ARGV[3], '[^\n]+') do alive[n] = true end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
-- a key or field some other writer damaged reads as missing
local kind = redis.call('TYPE', key)['ok']
if kind ~= 'hash' and kind ~= 'none' then redis.call('DEL', key) end
local function num(v)
  local x = tonumber(v)
  if x and x == x and x > -math.huge and x < math.huge then return x end
  return nil
end
local flat = redis.call('HGETALL', key)
local h = {}
for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
local out, ttl, forever, full = {}, 0, false, release
for b = 0, tonumber(ARGV[4]) - 1 do
  local at = 5 + b * 6
  local name, cap, rate = ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local held, credit = tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4])
  local lost = ARGV[at + 5] == '1' and not h[name .. '|l|' .. me]
  local gf, sf, lp, ap = name .. '|g', name .. '|s', name .. '|l|', name .. '|a|'
  local g = num(h[gf]) or cap
  -- a smaller capacity than the balance was kept for (a tenant moved to a
  -- smaller plan): cut before anything is granted
  if g > cap then g = cap end
  local stamp = num(h[sf]) or now
  local leased, holders = 0, 0
  for f, v in pairs(h) do
    if string.sub(f, 1, #lp) == lp then
      local node = string.sub(f, #lp + 1)
      if node ~= me then
        local settled = num(h[ap .. node])
        if alive[node] and not (settled and now - settled > 10000) then
          leased = leased + (num(v) or 0)
          holders = holders + 1
        else
          redis.call('HDEL', key, f, ap .. node)
        end
      end
    end
  end
  g = g - credit
  if lost and not release then g = g - held end
  -- a debt never exceeds one bucket
  if g < -cap then g = -cap end
  if rate > 0 and now > stamp then
    local room = cap - leased - held
    local refilled = g + (now - stamp) / 1000 * rate
    if refilled > room then refilled = math.max(g, room) end
    g = refilled
  end
  if now > stamp then stamp = now end
  local grant = 0
  if release then
    if not lost then g = g + held end
    redis.call('HDEL', key, lp .. me, ap .. me)
    if g > cap then g = cap end
    grant = cap > 0 and math.min(1, math.max(g, 0) / cap) or 1
  else
    local fair = (math.max(g, 0) + leased + held) / (holders + 1)
    -- a share below one token could never be spent
    if fair < 1 then fair = 1 end
    grant = math.min(math.max(g, 0), math.max(0, fair - held))
    g = g - grant
    redis.call('HSET', key, lp .. me, tostring(held + grant), ap .. me, tostring(now))
  end
  if g > cap then g = cap end
  full = full and g >= cap and holders == 0
  redis.call('HSET', key, gf, tostring(g), sf, tostring(stamp))
  if rate > 0 then
    local refilled_in = (cap - math.min(g, 0)) / rate * 1000 + 60000
    if refilled_in > ttl then ttl = refilled_in end
  else
    forever = true
  end
  out[b + 1] = tostring(grant)
end
-- a lease given back to buckets now full, with no other lease and no
-- bucket this settle did not carry, leaves a key like a new one: none
if full and redis.call('HLEN', key) == 2 * tonumber(ARGV[4]) then
  redis.call('DEL', key)
  return out
end
-- buckets this settle did not carry keep their expiry: only a longer one
-- is set on an existing key (a key without expiry keeps none)
if forever then
  redis.call('PERSIST', key)
elseif ttl > 0 then
  if #flat == 0 then
    redis.call('PEXPIRE', key, math.ceil(ttl))
  else
    redis.call('PEXPIRE', key, math.ceil(ttl), 'GT')
  end
end
return out
";

/// Sets one field of the shared state and bumps its version (a version
/// some other writer damaged starts again at 1: any change is news).
const STATE_PUT_LUA: &str = r"
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local v = redis.pcall('INCR', KEYS[2])
if type(v) ~= 'number' then
  redis.call('DEL', KEYS[2])
  v = redis.call('INCR', KEYS[2])
end
return v
";

pub struct ClusterService {
    control: Arc<Control>,
}

impl ClusterService {
    pub fn new(control: Arc<Control>) -> Self {
        ClusterService { control }
    }
}

#[async_trait::async_trait]
impl BackgroundService for ClusterService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(shared) = self.control.cluster.clone() else {
            return;
        };
        let mut sync = Syncer::new(Arc::clone(&self.control), shared);
        let me = sync.shared().node_id().to_string();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let heartbeat = Heartbeat::new(
            Arc::clone(sync.shared()),
            sync.key("nodes"),
            sync.caps_key(&me),
        )
        .start(Arc::clone(&stop));
        if let Err(e) = &heartbeat {
            log::error!(
                "cluster: the heartbeat thread did not start: {e}; this node is not seen alive"
            );
        }
        let mut settle = tokio::time::interval(sync.shared().config.sync_interval);
        let mut state = tokio::time::interval(STATE_POLL);
        for tick in [&mut settle, &mut state] {
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        loop {
            tokio::select! {
                _ = shutdown.changed() => {
                    // The last beat lands before the node leaves the set.
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    if let Ok(handle) = heartbeat {
                        let joined = tokio::task::spawn_blocking(move || handle.join());
                        let _ = tokio::time::timeout(Duration::from_secs(2), joined).await;
                    }
                    sync.leave().await;
                    return;
                }
                _ = settle.tick() => sync.settle().await,
                _ = state.tick() => sync.exchange_state().await,
            }
        }
    }
}

/// One settle: a tenant's buckets as this node holds them.
struct Job {
    tenant: CompactString,
    class: Due,
    release: bool,
    buckets: Vec<LeaseBucket>,
}

/// One bucket of a settle, as this node holds it.
struct LeaseBucket {
    /// The route's index; `None` for the tenant bucket.
    index: Option<u16>,
    /// Its fields' prefix in the tenant's hash.
    name: String,
    cap: f64,
    rate: f64,
    held: f64,
    credit: f64,
    /// A settle granted this lease before, so Redis should hold it.
    leased: bool,
}

/// Buckets that take longer than this to refill (or never do) keep their
/// key longer than a client's invented name deserves: their tenants are
/// bounded by count (`oneoff.rs`).
const LASTING_SECS: f64 = 60.0;

impl LeaseBucket {
    fn lasting(&self) -> bool {
        self.rate <= 0.0 || self.cap / self.rate > LASTING_SECS
    }
}

pub(super) struct Syncer {
    pub(super) control: Arc<Control>,
    pub(super) link: Link,
    /// Tenants this node holds state for, with their last request.
    tracked: HashMap<CompactString, Instant>,
    /// This node's admissions per capped tenant as last written.
    caps_written: HashMap<CompactString, u64>,
    /// Version of the shared state last applied, as read (`None`: load it
    /// all).
    state_version: Option<Vec<u8>>,
    pub(super) regions: super::regions::RegionSync,
    /// `Shared::reconnects` as last seen.
    reconnects: u64,
    last_settle: Instant,
    pub(super) one_offs: super::oneoff::OneOffs,
    settle_script: Script,
    state_script: Script,
}

impl Syncer {
    fn new(control: Arc<Control>, shared: Arc<Shared>) -> Self {
        Syncer {
            control,
            link: Link::new(shared, false),
            reconnects: 0,
            tracked: HashMap::new(),
            caps_written: HashMap::new(),
            state_version: None,
            regions: super::regions::RegionSync::default(),
            last_settle: Instant::now(),
            one_offs: super::oneoff::OneOffs::default(),
            settle_script: Script::new(SETTLE_LUA),
            state_script: Script::new(STATE_PUT_LUA),
        }
    }

    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.link.shared
    }

    pub(super) fn key(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.shared().config.key_prefix)
    }

    pub(super) fn tenant_key(&self, tenant: &str) -> String {
        self.key(&format!("t:{{{tenant}}}"))
    }

    fn caps_key(&self, node: &str) -> String {
        self.key(&format!("caps:{{{node}}}"))
    }

    /// Forgets what this node believed Redis holds once Redis was lost (it
    /// may come back empty): every count is written again, and the shared
    /// state read again.
    fn after_loss(&mut self) {
        let reconnects = self.link.shared.reconnects();
        let back = std::mem::replace(&mut self.reconnects, reconnects) != reconnects;
        if self.link.take_lost() || back {
            self.state_version = None;
            self.caps_written.clear();
        }
        if self.shared().take_caps_lost() {
            self.caps_written.clear();
        }
    }

    pub(super) async fn query<T: redis::FromRedisValue>(
        &mut self,
        what: &str,
        cmd: &redis::Cmd,
    ) -> Option<T> {
        self.link.query(what, cmd).await
    }

    /// Settles the tenants that spent, gives back idle leases, and shares
    /// admissions of capped tenants.
    async fn settle(&mut self) {
        self.after_loss();
        let now = Instant::now();
        let elapsed = now.duration_since(self.last_settle);
        self.last_settle = now;
        for tenant in self.shared().take_queue() {
            self.tracked.insert(tenant, now);
        }
        if !self.shared().redis_up() {
            self.refill_locally(elapsed);
            self.forget_idle_while_down(now);
            return;
        }
        let mut jobs = self.jobs(now);
        // Tenants whose keys last are stamped in the bounded set first:
        // if Redis does not take that, they wait for the next settle.
        let lasting: Vec<CompactString> = (jobs.iter())
            .filter(|job| job.buckets.iter().any(LeaseBucket::lasting))
            .map(|job| job.tenant.clone())
            .collect();
        if !self.stamp_lasting(&lasting).await {
            let (unstamped, rest): (Vec<Job>, Vec<Job>) = jobs
                .into_iter()
                .partition(|job| job.buckets.iter().any(LeaseBucket::lasting));
            self.restore_credit(&unstamped);
            jobs = rest;
        }
        // Top-ups of tenants that came back are granted before the rest
        // of the pass is even sent.
        let topups = jobs.partition_point(|job| job.class == Due::Topup);
        self.run_settles(&jobs[..topups]).await;
        self.run_settles(&jobs[topups..]).await;
        self.trim_lasting().await;
        if self.control.router.plans().any_cap() {
            self.share_admissions().await;
        }
    }

    /// Runs the settle script for each job, and applies what it answers.
    async fn run_settles(&mut self, jobs: &[Job]) {
        if jobs.is_empty() {
            return;
        }
        let alive = self.shared().alive_ids().join("\n");
        let me = self.shared().node_id().to_string();
        let keys: Vec<String> = jobs.iter().map(|j| self.tenant_key(&j.tenant)).collect();
        let invocations: Vec<_> = (jobs.iter().zip(&keys))
            .map(|(job, key)| settle_invocation(&self.settle_script, key, &me, &alive, job))
            .collect();
        let answers = (self.link)
            .each("settle", &invocations, |invocation, mut conn| async move {
                invocation.invoke_async::<Vec<String>>(&mut conn).await
            })
            .await;
        drop(invocations);
        for (job, answer) in jobs.iter().zip(answers) {
            match answer {
                Some(grants) => self.grant(job, &grants),
                None => self.restore_credit(std::slice::from_ref(job)),
            }
        }
    }

    /// What to settle this pass: tenants that spent since the last settle,
    /// and idle ones whose lease goes back; forgets tenants with nothing
    /// left. At most [`SETTLE_BUDGET`] settles, in the order of
    /// [`Due`]: a flood of invented names costs one pass its budget, never
    /// a real tenant its top-up. What the budget leaves out is untouched
    /// (still due at the next pass).
    fn jobs(&mut self, now: Instant) -> Vec<Job> {
        let router = &self.control.router;
        let now_ms = router.clock().now_ms();
        let mut due: Vec<(Due, Instant, CompactString)> = Vec::new();
        self.tracked.retain(|tenant, last| {
            let seen_now = *last == now;
            let idle = now.duration_since(*last) >= IDLE_RELEASE;
            let verdict = router.with_tenant(tenant, |entry, state| {
                let plans = router.plans();
                let limits = plans.limits_of(plans.current(tenant, state, now_ms));
                track(limits, entry.active() > 0, state, seen_now, idle, now_ms)
            });
            match verdict {
                // Forgotten by the table.
                None | Some(Track::Forget) => false,
                Some(Track::Keep) => true,
                Some(Track::Due(class)) => {
                    due.push((class, *last, tenant.clone()));
                    true
                }
            }
        });
        // Most recent traffic first within a class.
        due.sort_unstable_by(|a, b| (a.0, b.1).cmp(&(b.0, a.1)));
        due.truncate(SETTLE_BUDGET);
        let mut jobs = Vec::with_capacity(due.len());
        for (_, last, tenant) in due {
            let seen_now = last == now;
            let idle = now.duration_since(last) >= IDLE_RELEASE;
            let job = router.with_tenant(&tenant, |entry, state| {
                let plans = router.plans();
                let limits = plans.limits_of(plans.current(&tenant, state, now_ms));
                let live = entry.active() > 0;
                match track(limits, live, state, seen_now, idle, now_ms) {
                    Track::Due(class) => take_job(limits, state, &tenant, class, now_ms),
                    Track::Keep | Track::Forget => None,
                }
            });
            jobs.extend(job.flatten());
        }
        jobs
    }
}

/// The settle script's call for one job (on the tenant's `key`, for node
/// `me`).
fn settle_invocation<'a>(
    script: &'a Script,
    key: &str,
    me: &str,
    alive: &str,
    job: &Job,
) -> redis::ScriptInvocation<'a> {
    let mut invocation = script.key(key);
    invocation
        .arg(me)
        .arg(if job.release { "1" } else { "0" })
        .arg(alive)
        .arg(job.buckets.len());
    for b in &job.buckets {
        invocation
            .arg(&b.name)
            .arg(b.cap)
            .arg(b.rate)
            .arg(b.held)
            .arg(b.credit)
            .arg(if b.leased { "1" } else { "0" });
    }
    invocation
}

/// A settle due, in the order they are served: real traffic first,
/// invented names last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    /// A top-up of a lease this node settled before: a tenant that came
    /// back.
    Topup,
    /// A lease's first settle: a new tenant, or an invented name.
    Opening,
    /// An idle lease goes back.
    Release,
}

/// What a settle does for a tracked tenant.
enum Track {
    /// Nothing to settle now.
    Keep,
    /// No lease and nothing live: stop tracking.
    Forget,
    /// A settle is due (the tenant stays tracked).
    Due(Due),
}

/// Whether a tracked tenant needs a settle now (`seen_now`: it spent since
/// the last pass; `idle`: not for [`IDLE_RELEASE`]). Changes nothing but
/// the `queued` mark of a tenant with nothing to settle.
fn track(
    limits: &crate::limits::Limits,
    live: bool,
    state: &mut TenantState,
    seen_now: bool,
    idle: bool,
    now_ms: f64,
) -> Track {
    let Some(slot) = state.shared.as_deref_mut() else {
        // No lease: tracked only while it holds admissions.
        return if live { Track::Keep } else { Track::Forget };
    };
    if slot.dormant.is_some() {
        // Its lease went back; the bucket was not full.
        return if seen_now || live {
            Track::Keep
        } else {
            Track::Forget
        };
    }
    // Untouched: nothing to settle, unless the lease has been idle long
    // enough to go back (credit is charged first). Still queued: it spent
    // while Redis was down, or its last settle failed or was left out; it
    // is settled now like a tenant seen now.
    let touched = seen_now || slot.queued || (!idle && slot.has_credit());
    if !touched && !idle {
        return Track::Keep;
    }
    let class = match (touched, slot.settled_at > 0.0) {
        (false, _) => Due::Release,
        (true, true) => Due::Topup,
        (true, false) => Due::Opening,
    };
    // A lease in use with enough left is not settled yet.
    if touched && !needs_topup(state, now_ms) {
        if let Some(slot) = state.shared.as_deref_mut() {
            slot.queued = false;
        }
        return Track::Keep;
    }
    if !holds_lease(limits, state) && class != Due::Release {
        // Nothing Redis holds (unlimited buckets only).
        if let Some(slot) = state.shared.as_deref_mut() {
            slot.queued = false;
        }
        return Track::Keep;
    }
    Track::Due(class)
}

/// Takes a due settle's job out of the tenant's state: its credit moves
/// into the job; a release empties the node's buckets until Redis says how
/// full they are.
fn take_job(
    limits: &crate::limits::Limits,
    state: &mut TenantState,
    tenant: &CompactString,
    class: Due,
    now_ms: f64,
) -> Option<Job> {
    let release = class == Due::Release;
    let buckets = lease_of(limits, state);
    if let Some(slot) = state.shared.as_deref_mut() {
        slot.queued = false;
        slot.credit = 0.0;
        slot.route_credit.clear();
    }
    if release {
        if buckets.is_empty() {
            state.shared = None;
        } else if let Some(slot) = state.shared.as_deref_mut() {
            // Until Redis says how full the bucket is, a request reopens
            // on no credit at all. The lease goes: a reopened one is not
            // Redis' yet.
            slot.dormant = Some((0.0, now_ms));
            slot.low_water.clear();
        }
        if !limits.rate().is_unlimited() {
            state.buckets.tenant.tokens = 0.0;
        }
        state.buckets.routes.clear();
    }
    (!buckets.is_empty()).then(|| Job {
        tenant: tenant.clone(),
        class,
        release,
        buckets,
    })
}

/// A number the settle script returned: a finite amount, at least 0 (any
/// other reply, which only a damaged key could cause, counts as nothing).
fn amount(reply: &str) -> f64 {
    reply
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())
        .map_or(0.0, |x| x.max(0.0))
}

/// Whether a lease in use needs a settle now: credit to charge, a bucket
/// below its low-water mark, or a second since the last one.
fn needs_topup(state: &TenantState, now_ms: f64) -> bool {
    let Some(slot) = state.shared.as_deref() else {
        return false;
    };
    if slot.has_credit() || now_ms - slot.settled_at >= 1000.0 || slot.low_water.is_empty() {
        return true;
    }
    slot.low_water.iter().any(|(index, low)| match index {
        None => state.buckets.tenant.tokens < *low,
        Some(i) => state
            .buckets
            .routes
            .iter()
            .find(|(r, _)| r == i)
            .is_none_or(|(_, b)| b.tokens < *low),
    })
}

/// Whether [`lease_of`] has a bucket (without building it: every pass
/// asks this of every tenant due).
fn holds_lease(limits: &crate::limits::Limits, state: &TenantState) -> bool {
    state.shared.is_some()
        && (!limits.rate().is_unlimited()
            || (state.buckets.routes.iter())
                .any(|(i, _)| limits.route_name(*i).is_some() && limits.holds(*i).is_some()))
}

/// The tenant's buckets as this node holds them, with the credit on each.
fn lease_of(limits: &crate::limits::Limits, state: &TenantState) -> Vec<LeaseBucket> {
    let Some(slot) = state.shared.as_deref() else {
        return Vec::new();
    };
    // The last grant's buckets are the ones Redis holds a lease for.
    let leased = |index: Option<u16>| slot.low_water.iter().any(|(i, _)| *i == index);
    let mut buckets = Vec::new();
    let rule = limits.rate();
    if !rule.is_unlimited() {
        buckets.push(LeaseBucket {
            index: None,
            name: "t".to_string(),
            cap: rule.tokens,
            rate: rule.refill_per_second,
            // Never infinite: a bucket an unlimited plan left reopens
            // before it is settled (`Limits::after_move`).
            held: state.buckets.tenant.tokens.clamp(0.0, rule.tokens),
            credit: slot.credit,
            leased: leased(None),
        });
    }
    for (index, bucket) in &state.buckets.routes {
        // Only the plan's own limited buckets (not one another plan left).
        let (Some(name), Some(rule)) = (limits.route_name(*index), limits.holds(*index)) else {
            continue;
        };
        let credit = slot
            .route_credit
            .iter()
            .find(|(i, _)| i == index)
            .map_or(0.0, |(_, c)| *c);
        buckets.push(LeaseBucket {
            index: Some(*index),
            name: format!("r:{name}"),
            cap: rule.tokens,
            rate: rule.refill_per_second,
            held: bucket.tokens.clamp(0.0, rule.tokens),
            credit,
            leased: leased(Some(*index)),
        });
    }
    buckets
}

impl Syncer {
    /// Adds a settle's grants to the node's lease; after a release, records
    /// how full the bucket is (a full one is as if never seen).
    fn grant(&self, job: &Job, grants: &[String]) {
        if job.release {
            let fill = grants
                .iter()
                .map(|g| amount(g).min(1.0))
                .fold(1.0_f64, f64::min);
            self.control.router.with_tenant(&job.tenant, |_, state| {
                if let Some(slot) = state.shared.as_deref_mut() {
                    if let Some((_, at)) = slot.dormant {
                        if fill >= 1.0 && !slot.queued {
                            state.shared = None;
                        } else {
                            slot.dormant = Some((fill, at));
                        }
                    }
                }
            });
            return;
        }
        let now_ms = self.control.router.clock().now_ms();
        self.control.router.with_tenant(&job.tenant, |_, state| {
            let Some(slot) = state.shared.as_deref_mut() else {
                return;
            };
            slot.settled_at = now_ms;
            slot.low_water.clear();
            for (LeaseBucket { index, held, .. }, grant) in job.buckets.iter().zip(grants) {
                let grant = amount(grant);
                slot.low_water
                    .push((*index, ((held + grant) / 2.0).max(1.0)));
                let bucket = match index {
                    None => Some(&mut state.buckets.tenant),
                    Some(i) => state
                        .buckets
                        .routes
                        .iter_mut()
                        .find(|(r, _)| r == i)
                        .map(|(_, b)| b),
                };
                if let Some(bucket) = bucket {
                    bucket.tokens += grant;
                }
            }
        });
    }

    /// A settle that failed: its credit is charged at the next one. A
    /// release that failed leaves the lease with this node, to go back at a
    /// later one (else Redis would count it as leased for ever).
    fn restore_credit(&self, jobs: &[Job]) {
        let now = self.control.router.clock().now_ms();
        for job in jobs {
            self.control.router.with_tenant(&job.tenant, |_, state| {
                let Some(slot) = state.shared.as_deref_mut() else {
                    return;
                };
                if job.release && slot.dormant.is_some() {
                    slot.dormant = None;
                    slot.queued = true;
                    for LeaseBucket { index, held, .. } in &job.buckets {
                        match index {
                            None => state.buckets.tenant.tokens = *held,
                            Some(i) => state.buckets.routes.push((
                                *i,
                                crate::limits::TokenBucket {
                                    tokens: *held,
                                    last_refill_at: now,
                                },
                            )),
                        }
                    }
                    return;
                }
                for LeaseBucket { index, credit, .. } in &job.buckets {
                    match index {
                        None => slot.credit += credit,
                        Some(i) => slot.add_route_credit(*i, *credit),
                    }
                }
            });
        }
    }

    /// Redis is down and `local-share` applies: each lease refills at
    /// `1/N` of its rule up to its share of the capacity ([`share_of`]).
    fn refill_locally(&mut self, elapsed: Duration) {
        if self.shared().mode() != crate::cluster::Mode::Shared {
            return;
        }
        let n = self.shared().nodes_alive();
        let secs = elapsed.as_secs_f64();
        let router = &self.control.router;
        let now_ms = router.clock().now_ms();
        for tenant in self.tracked.keys() {
            router.with_tenant(tenant, |_, state| {
                let plans = router.plans();
                let limits = plans.limits_of(plans.current(tenant, state, now_ms));
                if state.shared.is_none() {
                    return;
                }
                let topup = |tokens: &mut f64, cap: f64, rate: f64| {
                    let room = (share_of(cap, n) - *tokens).max(0.0);
                    let add = (rate / n * secs).min(room);
                    *tokens += add;
                    add
                };
                // Not credit: Redis' own clock refills the shared bucket for
                // the same time, so charging these too would double them.
                let rule = limits.rate();
                if !rule.is_unlimited() {
                    topup(
                        &mut state.buckets.tenant.tokens,
                        rule.tokens,
                        rule.refill_per_second,
                    );
                }
                for (index, bucket) in state.buckets.routes.iter_mut() {
                    if let Some(rule) = limits.holds(*index) {
                        topup(&mut bucket.tokens, rule.tokens, rule.refill_per_second);
                    }
                }
            });
        }
    }

    /// Redis is down: a tenant idle for a second, holding no admission,
    /// whose buckets are full again at this node's share, is forgotten, as
    /// it would be with Redis up once its lease went back (its lease in
    /// Redis is dropped by the next settle of another node once its stamp
    /// is stale). Without this, every tenant that arrived during an outage
    /// would stay until Redis came back. A tenant kept is unqueued, so its
    /// next request queues it again and marks it seen.
    fn forget_idle_while_down(&mut self, now: Instant) {
        let router = &self.control.router;
        let n = self.shared().nodes_alive();
        let now_ms = router.clock().now_ms();
        let full = |tokens: f64, rule: &crate::limits::RateRule| {
            rule.is_unlimited() || tokens >= share_of(rule.tokens, n) - 1e-9
        };
        self.tracked.retain(|tenant, last| {
            let idle = now.duration_since(*last) >= IDLE_RELEASE;
            let kept = router.with_tenant(tenant, |entry, state: &mut TenantState| {
                let plans = router.plans();
                let limits = plans.limits_of(plans.current(tenant, state, now_ms));
                if let Some(slot) = state.shared.as_deref_mut() {
                    slot.queued = false;
                }
                if entry.active() > 0 || !idle {
                    return true;
                }
                let b = &state.buckets;
                let refilled = full(b.tenant.tokens, limits.rate())
                    && b.routes.iter().all(|(i, bucket)| {
                        limits
                            .holds(*i)
                            .is_none_or(|rule| full(bucket.tokens, rule))
                    });
                if refilled {
                    state.shared = None;
                    state.buckets = limits.fresh_buckets(now_ms);
                }
                !refilled
            });
            kept.unwrap_or(false)
        });
    }

    /// Writes this node's admissions per capped tenant (changes only) and
    /// reads every other live node's.
    async fn share_admissions(&mut self) {
        let me = self.shared().node_id().to_string();
        let key = self.caps_key(&me);
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
        if !changes.is_empty() {
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
                return;
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
        self.shared().set_others(others);
    }

    /// Writes this node's runtime changes, keeps the region assignments in
    /// step (`regions.rs`), and applies what other nodes changed.
    async fn exchange_state(&mut self) {
        self.after_loss();
        if !self.shared().redis_up() {
            return;
        }
        let state = self.key("{state}");
        let version = self.key("{state}:v");
        let pending = self.shared().take_pending();
        for (i, (field, value)) in pending.iter().enumerate() {
            let mut put = self.state_script.key(&state);
            put.key(&version).arg(field).arg(value);
            if self.link.invoke::<i64>("state", &put).await.is_none() {
                self.shared().requeue_pending(pending[i..].to_vec());
                return;
            }
        }
        if !self.sync_regions(self.state_version.is_none()).await {
            return;
        }
        // Compared as it is read: any change of the value is news.
        let get = redis::cmd("GET").arg(&version).to_owned();
        let Some(v) = self.query::<Option<Vec<u8>>>("state", &get).await else {
            return;
        };
        let Some(v) = v else {
            // No version: Redis is new or lost its data. Put back what
            // this node knows, so nodes that start later get it.
            self.shared().republish_known();
            self.state_version = Some(Vec::new());
            return;
        };
        if self.state_version.as_ref() == Some(&v) {
            return;
        }
        let read = redis::cmd("HGETALL").arg(&state).to_owned();
        let Some(all) = self.query::<Raw>("state", &read).await else {
            return;
        };
        // Shards first (what else refers to them), their names resolved
        // side by side: one slow name delays the others by nothing.
        let (shards, rest): (Vec<_>, Vec<_>) = (self.shared().news(text_pairs(all).collect()))
            .into_iter()
            .partition(|(field, _)| field.starts_with("shard:"));
        let control = &self.control;
        let added = shards.iter().map(|(f, v)| control.apply_shared(f, v));
        futures_util::future::join_all(added).await;
        for (field, value) in rest {
            self.control.apply_shared(&field, &value).await;
        }
        self.state_version = Some(v);
    }

    /// Shutdown: this node leaves at once instead of after its TTL.
    async fn leave(&mut self) {
        if !self.shared().redis_up() {
            return;
        }
        let me = self.shared().node_id().to_string();
        let zrem = redis::cmd("ZREM")
            .arg(self.key("nodes"))
            .arg(&me)
            .to_owned();
        let _ = self.query::<i64>("leave", &zrem).await;
        let del = redis::cmd("DEL").arg(self.caps_key(&me)).to_owned();
        let _ = self.query::<i64>("leave", &del).await;
        self.leave_regions().await;
    }
}
