"""The control plane's Redis connection: one server, or the primary that Sentinels
name (`connect`), through a bounded pool that retries a broken connection; and the
reply helpers the stores share (store.py, usage_store.py)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

P = "edgeplex:"  # every key's prefix
POOL = 32  # Redis connections of one control-plane process for its reads and writes
SENTINEL = "redis+sentinel"


class NotReplicated(RedisConnectionError):
    """A write that must survive a failover reached the primary but not enough
    replicas in time: not acknowledged (the caller answers UNAVAILABLE or retries)."""


class _BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """The primary's connections as Sentinel names it, bounded like the plain pool
    (a caller waits for a free connection rather than failing)."""


def connect(url: str, size: int = POOL) -> tuple[aioredis.Redis, bool]:
    """A client of the Redis that `url` names, with at most `size` connections, and
    whether Sentinels watch it: `redis://[user:password@]host:port/db`, or
    `redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]` for the
    primary that those Sentinels name `service` (the password is the primary's)."""
    # A restarted Redis leaves the pool's idle connections broken: each command on one
    # reconnects and is retried instead of failing the caller. The pool is bounded: a
    # thousand agents reporting at once wait their turn for one of POOL connections
    # instead of opening a thousand (a burst of connects that overflows Redis's accept
    # queue, and a file descriptor each).
    options: dict[str, Any] = {
        "max_connections": size,
        "timeout": 10.0,  # waiting for a free connection
        "decode_responses": False,
        "socket_connect_timeout": 2.0,
        "socket_timeout": 5.0,
        "retry": Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=3),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
    }
    scheme, _, rest = url.partition("://")
    if scheme != SENTINEL:
        pool = aioredis.BlockingConnectionPool.from_url(url, **options)
        return aioredis.Redis.from_pool(pool), False
    where, _, path = rest.partition("/")
    credentials, _, hosts = where.rpartition("@")
    user, _, password = credentials.partition(":")
    service, _, db = path.partition("/")
    sentinels = []
    for host in hosts.split(","):
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit() or not service:
            raise ValueError(
                f"redis URL {url!r}: expected {SENTINEL}://host:port[,host:port...]/service[/db]"
            )
        sentinels.append((name.strip("[]"), int(port)))
    manager = Sentinel(sentinels, socket_connect_timeout=2.0, socket_timeout=2.0)
    client = manager.master_for(
        urllib.parse.unquote(service),
        connection_pool_class=_BlockingSentinelPool,
        db=int(db or 0),
        username=urllib.parse.unquote(user) or None,
        password=urllib.parse.unquote(password) or None,
        **options,
    )
    return client, True


def names(reply: Any) -> list[str]:
    """The members a Redis range reply lists (no scores asked), as str."""
    return [text(member) for member in reply]


def chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for at in range(0, len(items), size):
        yield items[at : at + size]


def text(value: bytes | str) -> str:
    """A Redis reply as str (the client returns bytes)."""
    return value.decode() if isinstance(value, bytes) else value


def as_bytes(value: bytes | str) -> bytes:
    """A Redis reply as bytes."""
    return value.encode() if isinstance(value, str) else value
