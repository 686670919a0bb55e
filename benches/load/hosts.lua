-- wrk script: rotate through HOSTS tenant hosts (default 1000), each its
-- own tenant under SUFFIX (default .localhost).
--   HOSTS=1000 wrk -s benches/load/hosts.lua http://127.0.0.1:8080/
local n = tonumber(os.getenv("HOSTS") or "1000")
local suffix = os.getenv("SUFFIX") or ".localhost"
local i = 0

request = function()
  i = (i % n) + 1
  return wrk.format("GET", "/", { ["Host"] = "tenant-" .. i .. suffix })
end
