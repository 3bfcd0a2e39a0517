"""The rig's mosquitto, locked down as docs/security.md prescribes: no anonymous
clients and an ACL in which only the control plane writes the control topics.
The control plane manages the password and ACL files from then on: each
`admin site add` gives the site its own user and ACL entry and makes mosquitto
reload them (control_plane/broker_files.py).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from edgeplex.control_plane.broker_files import CP_USER, acl_text, set_password


class Broker:
    def __init__(self, state_dir: Path) -> None:
        self.conf = state_dir / "mosquitto.conf"
        self.passwords = state_dir / "mosquitto.passwd"
        self.acl = state_dir / "mosquitto.acl"
        self.pid = state_dir / "mosquitto.pid"

    def configure(
        self, host: str, advertise: str | None = None, port: int = 1883, tls: Path | None = None
    ) -> str:
        """Write the broker's files for a listener on `host` (TLS with the ca.pem,
        cert.pem and key.pem in `tls`, when given); returns the control plane's MQTT
        URL (to `advertise`, by default `host`)."""
        self.passwords.unlink(missing_ok=True)
        password = set_password(self.passwords, CP_USER)
        self.acl.write_text(acl_text({}))
        listener = f"listener {port} {host}\n"
        if tls is not None:
            listener += (
                f"cafile {tls / 'ca.pem'}\ncertfile {tls / 'cert.pem'}\n"
                f"keyfile {tls / 'key.pem'}\ntls_version tlsv1.2\n"
            )
        self.conf.write_text(
            f"{listener}allow_anonymous false\nuse_username_as_clientid true\n"
            f"password_file {self.passwords}\nacl_file {self.acl}\npid_file {self.pid}\n"
            + ("user root\n" if os.geteuid() == 0 else "")
        )
        scheme = "mqtts" if tls is not None else "mqtt"
        return f"{scheme}://{CP_USER}:{password}@{advertise or host}:{port}"

    def control_plane_env(self) -> dict[str, str]:
        return {
            "EDGEPLEX_CP_MQTT_PASSWORD_FILE": str(self.passwords),
            "EDGEPLEX_CP_MQTT_ACL_FILE": str(self.acl),
            "EDGEPLEX_CP_MQTT_PID_FILE": str(self.pid),
        }


def main() -> None:
    """Compose's broker container: write the files once into a volume shared with
    the control plane, with the control plane's MQTT URL in `cp.env` (0600)."""
    parser = argparse.ArgumentParser(prog="python -m edgeplex.rig.broker")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--listen", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=1883)
    parser.add_argument("--advertise", required=True, help="the broker's address for clients")
    parser.add_argument("--tls", type=Path, help="folder of ca.pem, cert.pem, key.pem: mqtts")
    args = parser.parse_args()
    broker = Broker(args.dir)
    env = args.dir / "cp.env"
    if broker.passwords.exists() and env.exists():
        return
    url = broker.configure(args.listen, args.advertise, args.port, args.tls)
    fd = os.open(env, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"EDGEPLEX_CP_MQTT_URL={url}\n")
        out.writelines(f"{k}={v}\n" for k, v in broker.control_plane_env().items())


if __name__ == "__main__":
    main()
