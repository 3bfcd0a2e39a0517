"""A userspace stand-in for `tc netem` on kernels without it (TCP only).

Inside a site's namespace, iptables redirects new TCP connections to other
regions' subnets to this proxy (`REDIRECT`), which reads the original
destination (SO_ORIGINAL_DST), connects to it with a socket mark that the
redirect rule skips, and relays bytes both ways, delivering each chunk the
region pair's one-way delay after it arrived. A round trip therefore costs
twice the delay, as with netem on both ends; unlike netem, the TCP handshake
itself is not delayed (connections are long-lived gRPC/HTTP channels here).

    python -m edgeplex.rig.delay_proxy --port 15001 --delay 10.77.2.0/24=30 ...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import socket
import struct
import time

SO_ORIGINAL_DST = 80
MARK = 0x7E  # the rig's iptables rules let marked (proxied) connections through


async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Copy reader -> writer, each chunk due `delay_s` after it was read."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, chunk = await queue.get()
            if not chunk:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    sender = asyncio.create_task(deliver())
    try:
        while chunk := await reader.read(1 << 16):
            await queue.put((time.monotonic() + delay_s, chunk))
    except OSError:
        pass
    await queue.put((0.0, b""))
    with contextlib.suppress(OSError):
        await sender


class DelayProxy:
    def __init__(self, delays: dict[ipaddress.IPv4Network, float]) -> None:
        self.delays = delays

    def delay_for(self, address: str) -> float:
        ip = ipaddress.IPv4Address(address)
        return next((d for net, d in self.delays.items() if ip in net), 0.0) / 1000

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
        port, packed = struct.unpack("!2xH4s8x", raw)
        host = socket.inet_ntoa(packed)
        upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        upstream.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, MARK)
        upstream.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(upstream, (host, port))
            up_reader, up_writer = await asyncio.open_connection(sock=upstream)
        except OSError:
            upstream.close()
            writer.close()
            return
        delay = self.delay_for(host)
        await asyncio.gather(
            relay(reader, up_writer, delay), relay(up_reader, writer, delay), return_exceptions=True
        )
        for w in (writer, up_writer):
            w.close()


async def serve(port: int, delays: dict[ipaddress.IPv4Network, float]) -> None:
    proxy = DelayProxy(delays)
    server = await asyncio.start_server(proxy.handle, "0.0.0.0", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=15001)
    parser.add_argument("--delay", action="append", default=[], help="SUBNET=MS, repeatable")
    args = parser.parse_args()
    delays = {}
    for item in args.delay:
        subnet, _, ms = item.partition("=")
        delays[ipaddress.IPv4Network(subnet)] = float(ms)
    asyncio.run(serve(args.port, delays))


if __name__ == "__main__":
    main()
