//! The settle pass: every `sync_interval` the tenants due (`due.rs`) are
//! settled with Redis by one script per tenant: their leases topped up or
//! given back, the credit they spent charged; what the script answers is
//! added to the node's buckets, and a failed settle keeps its credit.

use super::service::Syncer;
use compact_str::CompactString;
use due::Due;
use redis::Script;
use std::time::{Duration, Instant};

mod due;

/// A tenant untouched this long gives its lease back.
pub(super) const IDLE_RELEASE: Duration = Duration::from_secs(1);
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
pub(super) const SETTLE_LUA: &str = r"
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

impl Syncer {
    /// Settles the tenants that spent, gives back idle leases, and shares
    /// admissions of capped tenants.
    pub(super) async fn settle(&mut self) {
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

/// A number the settle script returned: a finite amount, at least 0 (any
/// other reply, which only a damaged key could cause, counts as nothing).
fn amount(reply: &str) -> f64 {
    reply
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())
        .map_or(0.0, |x| x.max(0.0))
}
