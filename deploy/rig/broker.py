"""The rig's mosquitto, locked down as docs/security.md prescribes: no anonymous
clients, one user for the control plane and one per site, and an ACL in which
only the control plane writes the control topics and each site reads only its
own desired state, its region's routes and the fleet's key topic.

Adding a site (the rig's `admin site add` step) writes its user and its ACL
entry and asks mosquitto to reload them (SIGHUP).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
from pathlib import Path

CP_USER = "edgeplex-cp"


def acl_text(site_regions: dict[str, str]) -> str:
    lines = [
        f"user {CP_USER}",
        "topic readwrite edgeplex/v1/#",
        "",
        "pattern read edgeplex/v1/sites/%u/desired",
        "pattern readwrite edgeplex/v1/sites/%u/presence",
        "pattern read edgeplex/v1/fleet/key",
    ]
    for site, region in sorted(site_regions.items()):
        lines += ["", f"user {site}", f"topic read edgeplex/v1/regions/{region}/routes"]
    return "\n".join(lines) + "\n"


class Broker:
    def __init__(self, state_dir: Path) -> None:
        self.conf = state_dir / "mosquitto.conf"
        self.passwords = state_dir / "mosquitto.passwd"
        self.acl = state_dir / "mosquitto.acl"
        self.users_file = state_dir / "mosquitto.users.json"  # mode 0600: the rig's own record

    def configure(self, host: str) -> str:
        """Write the broker's files; returns the control plane's MQTT URL."""
        self.passwords.write_text("")
        self.passwords.chmod(0o600)
        self.acl.write_text(acl_text({}))
        self.conf.write_text(
            f"listener 1883 {host}\nallow_anonymous false\n"
            f"password_file {self.passwords}\nacl_file {self.acl}\n"
            + ("user root\n" if os.geteuid() == 0 else "")
        )
        return f"mqtt://{CP_USER}:{self.add_user(CP_USER)}@{host}:1883"

    def add_user(self, user: str) -> str:
        password = secrets.token_hex(16)
        subprocess.run(
            ["mosquitto_passwd", "-b", str(self.passwords), user, password],
            check=True,
            capture_output=True,
        )
        return password

    def add_site(self, site: str, region: str, host: str, broker_pid: int | None) -> str:
        """The site's user (a new password each time) and ACL entry; its MQTT URL."""
        password = self.add_user(site)
        regions = json.loads(self.users_file.read_text()) if self.users_file.exists() else {}
        regions[site] = region
        self.users_file.write_text(json.dumps(regions))
        self.users_file.chmod(0o600)
        self.acl.write_text(acl_text(regions))
        if broker_pid:
            os.kill(broker_pid, signal.SIGHUP)  # mosquitto reloads passwords and ACL
        return f"mqtt://{site}:{password}@{host}:1883"
