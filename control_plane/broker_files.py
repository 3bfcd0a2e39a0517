"""The MQTT broker's password and ACL files, where the control plane manages them
(the rig; any single-host deployment that runs mosquitto beside it).

`edgeplex admin site add` then also gives the site its own broker user, with
a fresh password returned once beside the join token, and rewrites the ACL in
which only the control plane writes the control topics and each site reads
only its own desired state, its region's routes and the fleet's key topic;
mosquitto reloads both on SIGHUP. The broker binds each connection's client id
to its username (`use_username_as_clientid`), so no credential can take over
another's session; names of the fleet's own users are reserved. docs/security.md
shows the same settings for a broker run by others.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
from pathlib import Path

from edgeplex.durable import write_atomic

CP_USER = "edgeplex-cp"
RESERVED_PREFIX = "edgeplex-"  # the fleet's own broker users; never a site's


def reserved_site(site_id: str, cp_user: str = CP_USER) -> bool:
    """Whether `site_id` may not be enrolled: it would take over a service's broker user
    (and reset its password)."""
    return site_id == cp_user or site_id.lower().startswith(RESERVED_PREFIX)


def acl_text(
    site_regions: dict[str, str], cp_user: str = CP_USER, bridges: list[str] | tuple[str, ...] = ()
) -> str:
    """The broker's ACL: the control plane writes every fleet topic; each site reads
    its own desired state and its region's routes and writes its presence; each
    bridge (another broker's connection, bringing the fleet's topics to the sites
    there) reads every fleet topic."""
    lines = [
        f"user {cp_user}",
        "topic readwrite edgeplex/v1/#",
        "",
        "pattern read edgeplex/v1/sites/%u/desired",
        "pattern readwrite edgeplex/v1/sites/%u/presence",
        "pattern read edgeplex/v1/fleet/key",
    ]
    for bridge in bridges:
        lines += ["", f"user {bridge}", "topic read edgeplex/v1/#"]
    for site, region in sorted(site_regions.items()):
        lines += ["", f"user {site}", f"topic read edgeplex/v1/regions/{region}/routes"]
    return "\n".join(lines) + "\n"


def set_password(password_file: Path, user: str) -> str:
    """A new random password for `user` in a mosquitto password file (created 0600)."""
    if not password_file.exists():
        password_file.touch(mode=0o600)
    password = secrets.token_urlsafe(24)
    subprocess.run(
        ["mosquitto_passwd", "-b", str(password_file), user, password],
        check=True,
        capture_output=True,
    )
    return password


class BrokerFiles:
    def __init__(
        self,
        password_file: Path,
        acl_file: Path,
        pid_file: Path | None,
        cp_user: str,
        bridges: list[str] | tuple[str, ...] = (),
    ) -> None:
        self.password_file = password_file
        self.acl_file = acl_file
        self.pid_file = pid_file
        self.cp_user = cp_user
        self.bridges = bridges

    def add_site(self, site_id: str, site_regions: dict[str, str]) -> str:
        """Give `site_id` a user with a new password and rewrite the ACL for every
        site in `site_regions`; returns the password. Blocking: call in a thread."""
        if reserved_site(site_id, self.cp_user):
            raise ValueError(f"site_id {site_id!r} is reserved")
        password = set_password(self.password_file, site_id)
        text = acl_text(site_regions, self.cp_user, self.bridges)
        write_atomic(self.acl_file, text.encode(), 0o600)
        self.reload()
        return password

    def reload(self) -> None:
        if self.pid_file is None:
            return
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(self.pid_file.read_text().strip()), signal.SIGHUP)
