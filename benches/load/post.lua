-- wrk script for compare.sh's `post` shape: `POST /` with a fixed 1 KiB
-- JSON body (Content-Type: application/json), Host rotating over HOSTS
-- tenant hosts as in hosts.lua, and report.lua's WRK_RESULT line.
--   HOSTS=1000 wrk -s benches/load/post.lua http://127.0.0.1:18080/
local size = 1024
local head = '{"id":"3f1c9a52-7d4e-4b8a-9e61-0c2d5b7a8f13","type":"order.created",' ..
  '"tenant":"bench","items":[{"sku":"A-1001","qty":2,"price":19.99},' ..
  '{"sku":"B-2002","qty":1,"price":5.25}],"note":"'
local tail = '"}'
local body = head .. string.rep("x", size - #head - #tail) .. tail
assert(#body == size, "post.lua: body is " .. #body .. " bytes, not " .. size)

request_shape = {
  method = "POST",
  path = "/",
  body = body,
  headers = { ["Content-Type"] = "application/json" },
}
local dir = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
dofile(dir .. "/report.lua")
