"""The rig's mosquitto, locked down as docs/security.md prescribes: no anonymous
clients and an ACL in which only the control plane writes the control topics.
The control plane manages the password and ACL files from then on: each
`admin site add` gives the site its own user and ACL entry and makes mosquitto
reload them (control_plane/broker_files.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from edgeplex.control_plane.broker_files import CP_USER, acl_text, set_password


class Broker:
    def __init__(self, state_dir: Path) -> None:
        self.conf = state_dir / "mosquitto.conf"
        self.passwords = state_dir / "mosquitto.passwd"
        self.acl = state_dir / "mosquitto.acl"
        self.pid = state_dir / "mosquitto.pid"

    def configure(self, host: str) -> str:
        """Write the broker's files; returns the control plane's MQTT URL."""
        self.passwords.unlink(missing_ok=True)
        password = set_password(self.passwords, CP_USER)
        self.acl.write_text(acl_text({}))
        self.conf.write_text(
            f"listener 1883 {host}\nallow_anonymous false\n"
            f"password_file {self.passwords}\nacl_file {self.acl}\npid_file {self.pid}\n"
            + ("user root\n" if os.geteuid() == 0 else "")
        )
        return f"mqtt://{CP_USER}:{password}@{host}:1883"

    def control_plane_env(self) -> dict[str, str]:
        return {
            "EDGEPLEX_CP_MQTT_PASSWORD_FILE": str(self.passwords),
            "EDGEPLEX_CP_MQTT_ACL_FILE": str(self.acl),
            "EDGEPLEX_CP_MQTT_PID_FILE": str(self.pid),
        }
