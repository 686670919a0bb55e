-- wrk script: every request a new tenant (`r<thread>-<n>.localhost`), for
-- the bounded-memory test: an attacker inventing tenant ids.
local threads = 0
setup = function(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/", { ["Host"] = "r" .. tid .. "-" .. n .. ".localhost" })
end
