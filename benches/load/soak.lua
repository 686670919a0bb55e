-- wrk script for soak.sh: requests paced to a fixed rate, status codes
-- counted, one machine-readable WRK_RESULT line at the end.
--
--   SOAK_HOSTS=a.example.test,b.example.test   hosts to rotate over (real tenants; a
--                                               host listed twice gets twice the load)
--   SOAK_INVENT=1        instead: every request a new tenant, `i<random>-<thread>-<n><SOAK_SUFFIX>`
--   SOAK_SUFFIX=.localhost
--   SOAK_METHOD=GET      or POST (a 1 KiB JSON body)
--   SOAK_RATE=1000       requests per second, all threads together (0: as fast as wrk goes)
--   SOAK_T0=<unix time>  the run's start: answers other than 200/429 are listed as
--                        `second:status x count` (seconds since SOAK_T0; at most 500
--                        distinct pairs per thread)
--
--   SOAK_HOSTS=shop.example.test SOAK_RATE=500 wrk -t1 -c16 -d60s -s benches/load/soak.lua http://127.0.0.1:18680/
--
-- Pacing: each thread hands out send times 1/rate apart and a connection
-- waits (wrk's delay()) for its slot, so the rate holds as long as there
-- are enough connections for the latency (rate × latency < connections);
-- WRK_RESULT reports the rate achieved. Clock: clock_gettime through
-- LuaJIT's ffi (wrk's Lua is LuaJIT).
local ffi = require("ffi")
ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } soak_timespec;
  int clock_gettime(int clk, soak_timespec *ts);
]]
local ts = ffi.new("soak_timespec")
local function now_ms(clock)
  ffi.C.clock_gettime(clock, ts)
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end
local MONOTONIC, REALTIME = 1, 0

local threads = {}
function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

local hosts = {}
for h in string.gmatch(os.getenv("SOAK_HOSTS") or "", "[^,%s]+") do table.insert(hosts, h) end
local invent = (os.getenv("SOAK_INVENT") or "0") == "1"
local suffix = os.getenv("SOAK_SUFFIX") or ".localhost"
local method = os.getenv("SOAK_METHOD") or "GET"
local rate = tonumber(os.getenv("SOAK_RATE") or "1000")
local t0 = tonumber(os.getenv("SOAK_T0") or "0")
assert(invent or #hosts > 0, "soak.lua: set SOAK_HOSTS or SOAK_INVENT=1")

local body = nil
local headers = {}
if method == "POST" then
  body = '{"order":"' .. string.rep("x", 1024 - 13) .. '"}'
  headers["Content-Type"] = "application/json"
end

local interval, next_slot, started, prefix
local n = 0
s200, s429, s503, sother, others, nothers = 0, 0, 0, 0, {}, 0

function init(args)
  -- wrk starts every thread with the same Lua state: tell them apart.
  interval = rate > 0 and 1000 * threads_count_hint() / rate or 0
  math.randomseed(math.floor(now_ms(REALTIME)) + (tid or 0) * 7919)
  prefix = string.format("i%06x", math.random(0, 0xffffff))
  started = now_ms(MONOTONIC)
  next_slot = started
end

-- The number of threads: wrk runs setup() in the main state only, so each
-- thread reads it from the environment the driver sets (SOAK_THREADS).
function threads_count_hint()
  return tonumber(os.getenv("SOAK_THREADS") or "1")
end

function delay()
  if interval == 0 then return 0 end
  local now = now_ms(MONOTONIC)
  local slot = next_slot
  if slot < now - 1000 then slot = now - 1000 end -- do not burst to catch up more than 1 s
  next_slot = slot + interval
  local wait = slot - now
  return wait > 0 and math.floor(wait) or 0
end

request = function()
  n = n + 1
  local host
  if invent then
    host = prefix .. "-" .. tid .. "-" .. n .. suffix
  else
    host = hosts[(n - 1) % #hosts + 1]
  end
  headers["Host"] = host
  return wrk.format(method, "/", headers, body)
end

function response(status, hdrs, resp_body)
  if status == 200 then
    s200 = s200 + 1
  elseif status == 429 then
    s429 = s429 + 1
  elseif status == 503 then
    s503 = s503 + 1
  else
    sother = sother + 1
  end
  if status ~= 200 and status ~= 429 then
    local at = t0 > 0 and math.floor(now_ms(REALTIME) / 1000 - t0) or 0
    local key = at .. ":" .. status
    if others[key] then
      others[key] = others[key] + 1
    elseif nothers < 500 then
      nothers = nothers + 1
      others[key] = 1
    end
  end
end

function done(summary, latency, requests)
  local a200, a429, a503, aother, merged = 0, 0, 0, 0, {}
  for _, t in ipairs(threads) do
    a200 = a200 + (t:get("s200") or 0)
    a429 = a429 + (t:get("s429") or 0)
    a503 = a503 + (t:get("s503") or 0)
    aother = aother + (t:get("sother") or 0)
    for k, v in pairs(t:get("others") or {}) do merged[k] = (merged[k] or 0) + v end
  end
  local keys = {}
  for k in pairs(merged) do table.insert(keys, k) end
  table.sort(keys, function(a, b)
    return tonumber(a:match("^(-?%d+)")) < tonumber(b:match("^(-?%d+)")) or
      (tonumber(a:match("^(-?%d+)")) == tonumber(b:match("^(-?%d+)")) and a < b)
  end)
  local parts = {}
  for _, k in ipairs(keys) do table.insert(parts, k .. "x" .. merged[k]) end
  local list = #parts > 0 and table.concat(parts, ",") or "-"
  local e = summary.errors
  io.write(string.format(
    "WRK_RESULT requests=%d duration_us=%d rate=%.1f s200=%d s429=%d s503=%d sother=%d " ..
    "p50_us=%.0f p99_us=%.0f max_us=%.0f connect=%d read=%d write=%d timeout=%d others=%s\n",
    summary.requests, summary.duration, summary.requests / (summary.duration / 1e6),
    a200, a429, a503, aother, latency:percentile(50), latency:percentile(99), latency.max,
    e.connect, e.read, e.write, e.timeout, list))
end
