-- wrk script: POST one OIP inference request, read from the file named by
-- EDGEPLEX_WRK_BODY. With EDGEPLEX_WRK_HEADER (the JSON header's length) the body
-- uses the binary tensor extension; without it, it is plain JSON. With
-- EDGEPLEX_WRK_AUTHORIZATION, that is the Authorization header (a tenant's key).
local f = assert(io.open(os.getenv("EDGEPLEX_WRK_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*all")
f:close()
local header = os.getenv("EDGEPLEX_WRK_HEADER") or ""
if header ~= "" then
  wrk.headers["Inference-Header-Content-Length"] = header
  wrk.headers["Content-Type"] = "application/octet-stream"
else
  wrk.headers["Content-Type"] = "application/json"
end

local authorization = os.getenv("EDGEPLEX_WRK_AUTHORIZATION") or ""
if authorization ~= "" then
  wrk.headers["Authorization"] = authorization
end

function response(status, headers, body)
  if status ~= 200 then
    wrk.thread:stop()
  end
end
