-- wrk script for compare.sh's `upload` shape: `POST /upload` with a 1 MiB
-- body (Content-Length, application/octet-stream), Host rotating over HOSTS
-- tenant hosts as in hosts.lua, and report.lua's WRK_RESULT line.
--   HOSTS=1000 wrk -s benches/load/upload.lua http://127.0.0.1:18080/
-- UPLOAD_BYTES (default 1048576) changes the size.
local size = tonumber(os.getenv("UPLOAD_BYTES") or "1048576")

request_shape = {
  method = "POST",
  path = "/upload",
  body = string.rep("u", size),
  headers = { ["Content-Type"] = "application/octet-stream" },
}
local dir = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
dofile(dir .. "/report.lua")
