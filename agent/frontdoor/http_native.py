"""The HTTP door on the agent's own loop: HTTP/1.1 parsed by llhttp (httptools).

It serves the same routes and handlers as the aiohttp door (http.py's
`HttpApi`): a handler gets a small request object with what the handlers use
(match_info, headers, content_length, path_qs, read) and returns the same
`web.Response`, whose status, headers and body are written here in one write
(binary outputs as views of the output arrays: oip_response.py).
What aiohttp adds per request on top (its request and response objects, its
router, the task per request it keeps for streaming) is left out: one request
costs about 30 µs less (docs/benchmarks.md, "The hot path").

HTTP as this door speaks it:
- keep-alive (HTTP/1.1's default; `Connection: close` and HTTP/1.0 honoured),
  pipelined requests answered in order, reading paused while 16 wait;
- bodies by Content-Length or chunked, up to the agent's body cap (413 beyond,
  and the connection closes), `Expect: 100-continue` answered;
- request line and headers together at most 64 KiB (431 beyond);
- HEAD on every GET route; 404 for an unknown path, 405 with `Allow` for a
  known path and another method;
- a request that does not parse gets 400 and the connection closes;
- a connection idle for 75 s closes, as aiohttp's does, and so does one that
  stalls that long in the middle of a request.
A client that disconnects does not cancel its request: the answer is dropped.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable
from ssl import SSLContext
from typing import Any
from urllib.parse import unquote

import httptools
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from edgeplex.agent.frontdoor.oip_response import Buffer, TensorResponse

log = logging.getLogger("edgeplex.agent.http")

KEEPALIVE_S = 75.0
MAX_HEAD_BYTES = 64 * 1024
MAX_PIPELINED = 16
Handler = Callable[[Any], Awaitable[web.StreamResponse]]


class Request:
    """What the handlers read of a request (the part of aiohttp's they use)."""

    __slots__ = ("_body", "content_length", "headers", "match_info", "method", "path_qs")

    def __init__(
        self,
        method: str,
        path_qs: str,
        headers: CIMultiDictProxy[str],
        body: bytes,
    ) -> None:
        self.method = method
        self.path_qs = path_qs
        self.headers = headers
        self.match_info: dict[str, str] = {}
        length = headers.get("Content-Length")
        self.content_length = int(length) if length and length.isdigit() else None
        self._body = body

    async def read(self) -> bytes:
        return self._body


class Routes:
    """aiohttp's route definitions, matched as aiohttp matches them: `{name}` is one
    path segment, percent-decoded."""

    def __init__(self, defs: list[web.RouteDef]) -> None:
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []
        for d in defs:
            pattern = re.sub(r"\\{(\w+)\\}", r"(?P<\1>[^/]+)", re.escape(d.path))
            self._routes.append((d.method, re.compile(pattern + "$"), d.handler))

    def resolve(self, method: str, path: str) -> tuple[Handler | None, dict[str, str], list[str]]:
        """(handler, match_info, []) or (None, {}, the methods the path allows)."""
        allowed = []
        for route_method, pattern, handler in self._routes:
            m = pattern.match(path)
            if m is None:
                continue
            if route_method == method or (method == "HEAD" and route_method == "GET"):
                return handler, m.groupdict(), []
            allowed.append(route_method)
        return None, {}, allowed


def encode(response: web.StreamResponse, keep_alive: bool, head: bool) -> list[Buffer]:
    """A whole response as the buffers to write: status line and headers, then the
    body (one buffer, or a TensorResponse's parts as they are)."""
    assert isinstance(response, web.Response)
    if isinstance(response, TensorResponse):
        parts, length = response.parts, response.body_bytes
    else:
        body = response.body if isinstance(response.body, bytes) else b""
        parts, length = [body], len(body)
    lines = [f"HTTP/1.1 {response.status} {response.reason}"]
    lines += [f"{k}: {v}" for k, v in response.headers.items() if k.lower() != "content-length"]
    lines.append(f"Content-Length: {length}")
    lines.append(f"Date: {_date()}")
    lines.append("Server: edgeplex")
    if not keep_alive:
        lines.append("Connection: close")
    head_bytes = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
    if head:
        return [head_bytes]
    if len(parts) == 1 and isinstance(parts[0], bytes):
        return [head_bytes + parts[0]]  # one small copy beats a writev of two
    return [head_bytes, *parts]


_dated = (0, "")


def _date() -> str:
    global _dated
    now = int(time.time())
    if now != _dated[0]:
        _dated = (now, email.utils.formatdate(now, usegmt=True))
    return _dated[1]


def plain(status: int, text: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=text, headers=headers)


class Door:
    """One listening socket's routes and limits, shared by its connections."""

    def __init__(self, routes: Routes, max_body: int) -> None:
        self.routes = routes
        self.max_body = max_body
        self.connections: set[Connection] = set()

    async def handle(self, request: Request, path: str) -> web.StreamResponse:
        handler, match_info, allowed = self.routes.resolve(request.method, path)
        if handler is None:
            if allowed:
                allow = ",".join(sorted(set(allowed)))
                return plain(405, "405: Method Not Allowed", {"Allow": allow})
            return plain(404, "404: Not Found")
        request.match_info = match_info
        try:
            return await handler(request)
        except Exception:  # a bug answers 500 and leaves the connection serving
            log.exception("%s %s failed", request.method, path)
            return plain(500, "500 Internal Server Error")


class Connection(asyncio.Protocol):
    def __init__(self, door: Door) -> None:
        self.door = door
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiting: deque[tuple[Request, str, bool]] = deque()
        self.busy = False
        self.paused = False
        self._idle: asyncio.TimerHandle | None = None
        self._begin()

    # --- asyncio's side ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.door.connections.add(self)
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            # A refusal raised in a callback arrives wrapped by the parser.
            refused = exc.__context__ if isinstance(exc.__context__, _Refused) else None
            if refused is not None:
                self._close_with(refused.status, refused.text)
            else:
                self._close_with(400, "400: Bad Request")
        if not self.busy and not self.waiting:  # mid-request: a client that stalls is idle
            self._arm_idle()
        if len(self.waiting) >= MAX_PIPELINED and not self.paused and self.transport:
            self.transport.pause_reading()
            self.paused = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.door.connections.discard(self)
        if self._idle is not None:
            self._idle.cancel()
        self.transport = None

    # --- llhttp's callbacks -----------------------------------------------------------------

    def _begin(self) -> None:
        self.url = b""
        self.head_bytes = 0
        self.header_list: list[tuple[str, str]] = []
        self.headers: CIMultiDictProxy[str] = _NO_HEADERS  # set once they are all in
        self.body: list[bytes] = []
        self.body_bytes = 0

    def on_message_begin(self) -> None:
        self._begin()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value))
        self.header_list.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        headers = self.headers = CIMultiDictProxy(CIMultiDict(self.header_list))
        length = headers.get("Content-Length", "")
        if length.isdigit() and int(length) > self.door.max_body:
            raise _Refused(413, f"413: the body exceeds {self.door.max_body} bytes")
        if headers.get("Expect", "").lower() == "100-continue" and self.transport:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, chunk: bytes) -> None:
        self.body_bytes += len(chunk)
        if self.body_bytes > self.door.max_body:
            raise _Refused(413, f"413: the body exceeds {self.door.max_body} bytes")
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        method = self.parser.get_method().decode("ascii", "replace")
        url = self.url.decode("latin-1")
        path = unquote(httptools.parse_url(self.url).path.decode("latin-1"))
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        request = Request(method, url, self.headers, body)
        self.waiting.append((request, path, self.parser.should_keep_alive()))
        if not self.busy:
            self.busy = True
            asyncio.get_running_loop().create_task(self._serve())

    def _count(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > MAX_HEAD_BYTES:
            raise _Refused(431, "431: Request Header Fields Too Large")

    # --- answering --------------------------------------------------------------------------

    async def _serve(self) -> None:
        try:
            while self.waiting and self.transport is not None:
                request, path, keep_alive = self.waiting.popleft()
                if self.paused and self.transport is not None:
                    self.transport.resume_reading()
                    self.paused = False
                response = await self.door.handle(request, path)
                if self.transport is None or self.transport.is_closing():
                    return  # the client left: its answer has no one to go to
                try:
                    data = encode(response, keep_alive, request.method == "HEAD")
                except Exception:  # a bug must not leave the client waiting
                    log.exception("%s %s: the response could not be written", request.method, path)
                    self._close_with(500, "500 Internal Server Error")
                    return
                if len(data) == 1:
                    self.transport.write(data[0])
                else:
                    self.transport.writelines(data)
                if not keep_alive:
                    self.transport.close()
                    return
        finally:
            self.busy = False
        self._arm_idle()

    def _arm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self.transport is not None and not self.waiting:
            loop = asyncio.get_running_loop()
            self._idle = loop.call_later(KEEPALIVE_S, self.transport.close)

    def _close_with(self, status: int, text: str) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.waiting.clear()
        self.transport.writelines(encode(plain(status, text), keep_alive=False, head=False))
        self.transport.close()


_NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())


class _Refused(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


class NativeHttp:
    """The running door: `cleanup` stops it, as aiohttp's AppRunner's does."""

    def __init__(self, server: asyncio.AbstractServer, door: Door) -> None:
        self._server, self._door = server, door

    async def cleanup(self) -> None:
        self._server.close()
        for conn in list(self._door.connections):
            if conn.transport is not None:
                conn.transport.close()
        await self._server.wait_closed()


async def start_native_http(
    routes: list[web.RouteDef], host: str, port: int, max_body: int, ssl: SSLContext | None
) -> tuple[NativeHttp, int]:
    door = Door(Routes(routes), max_body)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(door), host, port, ssl=ssl)
    bound = server.sockets[0].getsockname()[1] if server.sockets else port
    return NativeHttp(server, door), bound
