-- wrk script: POST one OIP binary-tensor inference request, read from the file
-- named by EDGEPLEX_WRK_BODY; the JSON header length comes from EDGEPLEX_WRK_HEADER.
local f = assert(io.open(os.getenv("EDGEPLEX_WRK_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*all")
f:close()
wrk.headers["Inference-Header-Content-Length"] = os.getenv("EDGEPLEX_WRK_HEADER")
wrk.headers["Content-Type"] = "application/octet-stream"

function response(status, headers, body)
  if status ~= 200 then
    wrk.thread:stop()
  end
end
