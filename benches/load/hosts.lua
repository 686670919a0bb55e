-- wrk script: rotate through HOSTS tenant hosts (default 1000), each its
-- own tenant under SUFFIX (default .localhost).
--   HOSTS=1000 wrk -s benches/load/hosts.lua http://127.0.0.1:8080/
--
-- Each request is `GET /`. A script that wants another request shape sets
-- the global `request_shape` before loading this file (post.lua, upload.lua):
--   request_shape = { method = "POST", path = "/", body = "...",
--                     headers = { ["Content-Type"] = "application/json" } }
-- wrk.format adds Content-Length when there is a body.
local n = tonumber(os.getenv("HOSTS") or "1000")
local suffix = os.getenv("SUFFIX") or ".localhost"
local shape = request_shape or {}
local method, path, body = shape.method or "GET", shape.path or "/", shape.body
local extra = shape.headers or {}
local i = 0

if next(extra) == nil then
  -- GET / (or a shape without extra headers): the request as it always was.
  request = function()
    i = (i % n) + 1
    return wrk.format(method, path, { ["Host"] = "tenant-" .. i .. suffix }, body)
  end
else
  request = function()
    i = (i % n) + 1
    local headers = { ["Host"] = "tenant-" .. i .. suffix }
    for name, value in pairs(extra) do headers[name] = value end
    return wrk.format(method, path, headers, body)
  end
end
