-- wrk script for compare.sh: the rotating-hosts workload of hosts.lua
-- (HOSTS tenant hosts, default 1000) plus one machine-readable summary line
-- at the end, so that no human-formatted wrk output has to be parsed.
--   HOSTS=1000 wrk -s benches/load/report.lua http://127.0.0.1:18080/
-- post.lua and upload.lua set `request_shape` (see hosts.lua) and load this
-- file, so that every shape reports the same line.
local dir = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
dofile(dir .. "/hosts.lua")

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRK_RESULT requests=%d duration_us=%d bytes=%d p50_us=%.0f p99_us=%.0f max_us=%.0f " ..
    "connect=%d read=%d write=%d status=%d timeout=%d\n",
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(99), latency.max,
    e.connect, e.read, e.write, e.status, e.timeout))
end
