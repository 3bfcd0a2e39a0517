#!/opt/edgeplex/bin/python
"""The image's HEALTHCHECK: healthy when EDGEPLEX_HEALTH answers.

EDGEPLEX_HEALTH is an http:// URL that must answer 200 (by default the agent's
readiness, http://127.0.0.1:8000/v2/health/ready; the control plane's is
http://127.0.0.1:7071/healthz), or tcp://HOST:PORT that must accept a connection
(Redis, mosquitto).
"""

import os
import socket
import sys
import urllib.parse
import urllib.request

target = os.environ.get("EDGEPLEX_HEALTH", "http://127.0.0.1:8000/v2/health/ready")
parsed = urllib.parse.urlparse(target)
try:
    if parsed.scheme == "tcp":
        socket.create_connection((parsed.hostname, parsed.port), timeout=3).close()
    else:
        with urllib.request.urlopen(target, timeout=3) as reply:
            if reply.status != 200:
                sys.exit(f"{target}: {reply.status}")
except OSError as exc:
    sys.exit(f"{target}: {exc}")
