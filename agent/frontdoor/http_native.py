"""The HTTP door on the agent's own loop: HTTP/1.1 parsed by llhttp (httptools),
written as if the network were hostile.

It serves the routes of http.py's `HttpApi` (the aiohttp door serves the same):
a handler gets a small request object with what the handlers use (match_info,
headers, content_length, path_qs, read) and returns a `web.Response`, whose
status, headers and body are written here in one write (binary outputs as
views of the output arrays: oip_response.py). What aiohttp adds per request
(its request and response objects, its router, a task per request) is left
out: one request costs about 30 µs less (docs/lab-notebook.md).

Everything is decided from the request line and headers, before a body byte is
buffered: the route (404, 405 with `Allow`), the caller's credential (401,
403), the body's declared size against the route's cap (413), and, for
inference, admission through the agent's in-flight gate (429 with
Retry-After). A refusal is answered in turn with the requests pipelined ahead
of it; when a body was announced and left unread, the connection then closes.
A chunked body is counted as it arrives and cut at the cap.

Deadlines (DoorSettings) are absolute, so trickling extends none of them: a
connection idle for `keepalive_timeout_s` closes; the first byte of a request
starts `header_timeout_s` for its line and headers (408 beyond), and its
headers start the body's (`body_timeout_s` + size / `body_min_rate`, 408
beyond). Header count and size are capped (431); at most `max_pipelined`
requests are read ahead, and reading stops while the client does not read its
answers. Connections are capped in total and per address, longest-idle closed
first (connections.py). A request that does not parse gets 400 and the
connection closes. A client that disconnects does not cancel its request: the
answer is dropped.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import re
import time
from collections import deque
from ssl import SSLContext
from urllib.parse import unquote

import httptools
import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from edgeplex.agent.frontdoor.auth import Access, Credentials
from edgeplex.agent.frontdoor.connections import ConnectionLimiter
from edgeplex.agent.frontdoor.gate import InflightGate, Pass
from edgeplex.agent.frontdoor.http import Handler, Reply, Route, error_response
from edgeplex.agent.frontdoor.oip_response import Buffer, TensorResponse
from edgeplex.agent.frontdoor.settings import DoorSettings
from edgeplex.agent.observability.metrics import METRICS
from edgeplex.agent.oip.errors import ServeError

log = logging.getLogger("edgeplex.agent.http")

LINGER_S = 2.0  # after a refusal that left a body unread (see Connection._stop)
SWEEP_S = 0.5  # how often the door checks its connections' deadlines

KNOWN_PATHS, KNOWN_PATH_LENGTH = 512, 256  # paths whose route the door keeps (Routes)

# What a connection is doing, for its deadline (checked by the door's sweep).
IDLE, HEAD, BODY, SERVING, LINGER = range(5)


class Request:
    """What the handlers read of a request (the part of aiohttp's they use)."""

    __slots__ = ("_body", "admitted", "caller", "content_length", "headers", "match_info",
                 "method", "path_qs", "received", "remote")  # fmt: skip

    def __init__(self, method: str, path_qs: str, headers: CIMultiDictProxy[str],
                 match_info: dict[str, str], admitted: Pass | None,
                 received: float) -> None:  # fmt: skip
        self.method = method
        self.path_qs = path_qs
        self.headers = headers
        self.match_info = match_info
        length = headers.get("Content-Length")
        self.content_length = int(length) if length and length.isdigit() else None
        self.admitted = admitted  # the gate's pass, taken from the headers
        self.received = received  # loop.time() its headers were complete: its deadline's start
        self._body: bytes | bytearray = b""
        self.remote = ""  # the client's address
        self.caller = ""  # who the credentials check said it is (auth.Credentials.check)

    async def read(self) -> bytes | bytearray:
        return self._body


class Routes:
    """Route definitions matched as aiohttp matches them: `{name}` is one path
    segment, percent-decoded. The patterns are anchored and have no nested
    repetition, so matching is linear in the path. The answers for the last few
    hundred paths matched are kept: clients repeat theirs, and a request then
    costs one lookup instead of a match per route."""

    def __init__(self, table: list[Route]) -> None:
        self._routes: list[tuple[re.Pattern[str], Route]] = []
        for route in table:
            pattern = re.sub(r"\\{(\w+)\\}", r"(?P<\1>[^/]+)", re.escape(route.path))
            self._routes.append((re.compile(pattern + "$"), route))
        self._known: dict[tuple[str, str], tuple[Route | None, dict[str, str], list[str]]] = {}

    def resolve(self, method: str, path: str) -> tuple[Route | None, dict[str, str], list[str]]:
        """(route, match_info, []) or (None, {}, the methods the path allows); the
        match_info handed out is a copy."""
        known = self._known.get((method, path))
        if known is None:
            known = self._match(method, path)
            if len(path) <= KNOWN_PATH_LENGTH:
                if len(self._known) >= KNOWN_PATHS:
                    self._known.clear()  # bounded, whatever paths clients send
                self._known[(method, path)] = known
        route, match_info, allowed = known
        return route, dict(match_info), allowed

    def _match(self, method: str, path: str) -> tuple[Route | None, dict[str, str], list[str]]:
        allowed = []
        for pattern, route in self._routes:
            m = pattern.match(path)
            if m is None:
                continue
            if route.method == method or (method == "HEAD" and route.method == "GET"):
                return route, m.groupdict(), []
            allowed.append(route.method)
        return None, {}, allowed


def encode(response: Reply, keep_alive: bool, head: bool
           ) -> list[Buffer]:  # fmt: skip
    """A whole response as the buffers to write: status line and headers, then the
    body (one buffer, or a TensorResponse's parts as they are)."""
    if isinstance(response, TensorResponse):
        parts, length = response.parts, response.body_bytes
    else:
        assert isinstance(response, web.Response)
        body = response.body if isinstance(response.body, bytes) else b""
        parts, length = [body], len(body)
    text = f"HTTP/1.1 {response.status} {response.reason}\r\n"
    for name, value in response.headers.items():
        if name.lower() != "content-length":
            text += f"{name}: {value}\r\n"
    text += f"Content-Length: {length}\r\nDate: {_date()}\r\nServer: edgeplex\r\n"
    text += "\r\n" if keep_alive else "Connection: close\r\n\r\n"
    head_bytes = text.encode("latin-1", "replace")
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


def json_error(status: int, text: str, headers: dict[str, str] | None = None) -> web.Response:
    """The door's own answer, as every HTTP error of the agent is: {"error": text},
    so tritonclient and Triton's examples can read it."""
    body = orjson.dumps({"error": text})
    return web.Response(status=status, body=body, headers=headers, content_type="application/json")


class Door:
    """One listening socket's routes, limits and connections."""

    def __init__(self, routes: Routes, credentials: Credentials, gate: InflightGate,
                 limits: DoorSettings) -> None:  # fmt: skip
        self.routes = routes
        self.credentials = credentials
        self.gate = gate
        self.limits = limits
        self.connections = ConnectionLimiter(
            "http", limits.max_connections, limits.max_connections_per_client,
            limits.abuse_penalty_s,
        )  # fmt: skip
        self.open: set[Connection] = set()
        self._sweep: asyncio.TimerHandle | None = None

    def start_sweeping(self) -> None:
        """Check every connection's deadline each SWEEP_S: one timer for the door
        instead of one armed and cancelled per request, at half a second's precision
        (nginx's timers are as coarse)."""
        now = time.monotonic()
        for conn in list(self.open):
            conn.check_deadline(now)
        self._sweep = asyncio.get_running_loop().call_later(SWEEP_S, self.start_sweeping)

    def stop_sweeping(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()

    def decide(
        self,
        method: str,
        path: str,
        headers: CIMultiDictProxy[str],
        declared: int,
        client: str = "",
    ) -> tuple[Route, dict[str, str], Pass | None, str] | web.Response:
        """From the head alone: the route, its match, its gate pass and who the caller
        is (auth.Credentials.check), or the refusal."""
        route, match_info, allowed = self.routes.resolve(method, path)
        if route is None:
            if allowed:
                allow = ",".join(sorted(set(allowed)))
                return json_error(405, "405: Method Not Allowed", {"Allow": allow})
            return json_error(404, "404: Not Found")
        if declared > route.max_body:
            return json_error(413, f"413: the body exceeds {route.max_body} bytes")
        caller = ""
        try:
            if route.access != Access.OPEN:
                authorization = headers.get("Authorization")
                caller = self.credentials.check(route.access, authorization, route.what, client)
            admitted = self.gate.admit(declared) if route.admits else None
        except ServeError as exc:
            return error_response(exc)
        return route, match_info, admitted, caller

    @staticmethod
    async def handle(handler: Handler, request: Request, path: str) -> Reply:
        try:
            return await handler(request)  # type: ignore[arg-type]  # the part it reads
        except ServeError as exc:
            return error_response(exc)
        except Exception:  # a bug answers 500 and leaves the connection serving
            log.exception("%s %s failed", request.method, path)
            return json_error(500, "500 Internal Server Error")


# What a connection queues to answer in order: a request and its handler, or a
# refusal decided from the head (with whether the connection closes after it).
_Work = tuple[Request, Handler, str, bool] | tuple[web.Response, bool]


class Connection(asyncio.Protocol):
    """One client connection; every method runs on the event loop."""

    def __init__(self, door: Door) -> None:
        self.door = door
        self.loop = asyncio.get_running_loop()  # held: each lookup is a getpid() call
        self.limits = door.limits
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.client = ""
        self.waiting: deque[_Work] = deque()
        self.busy = False  # _serve is running
        self.reading = True
        self.stopped = False  # a refusal ends the connection: ignore what follows
        self.linger = False  # after that refusal, discard the unread body a while
        self.drained: asyncio.Future[None] | None = None  # set while writing is paused
        self.phase, self.since = IDLE, time.monotonic()  # for the deadline
        self._begin()

    # --- asyncio's side ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.client = str((transport.get_extra_info("peername") or ("",))[0])
        if not self.door.connections.admit(self, self.client):
            transport.abort()  # type: ignore[attr-defined]
            return
        self.door.open.add(self)
        self._idle()

    def data_received(self, data: bytes) -> None:
        if self.stopped:
            return  # discarded (lingering after a refusal) or after the end
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            # A refusal raised in a callback arrives wrapped by the parser.
            refused = exc.__context__ if isinstance(exc.__context__, _Refused) else None
            if refused is None:
                METRICS.door_refusals.labels(door="http", reason="bad_request").inc()
                refused = _Refused(json_error(400, "400: Bad Request"), linger=False)
            self._stop(refused.response, refused.linger)
            return
        if len(self.waiting) >= self.limits.max_pipelined:
            self._pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.door.connections.leave(self, self.client)
        self.door.open.discard(self)
        self.transport = None
        if self.admitted is not None:
            self.admitted.release()
        for work in self.waiting:
            if isinstance(work[0], Request) and work[0].admitted is not None:
                work[0].admitted.release()
        self.waiting.clear()
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def pause_writing(self) -> None:
        """The client does not read its answers: answer no more until it does."""
        self.drained = self.loop.create_future()
        self._pause_reading()

    def resume_writing(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.drained = None
        # Reading was paused with writing: the client has read its answers, so its
        # next request may come (else a keep-alive client waits for an answer to a
        # request the door never reads).
        if not self.stopped and len(self.waiting) < self.limits.max_pipelined:
            self._resume_reading()

    def close_idle(self) -> None:
        """The door needs the room this idle connection holds."""
        if self.transport is not None:
            self.transport.close()

    # --- llhttp's callbacks: one request's head, then its body --------------------------------

    def _begin(self) -> None:
        self.url = b""
        self.head_bytes = 0
        self.header_list: list[tuple[str, str]] = []
        self.headers: CIMultiDictProxy[str] = _NO_HEADERS  # set once they are all in
        self.method = ""
        self.path = ""
        self.route: Route | None = None
        self.match_info: dict[str, str] = {}
        self.admitted: Pass | None = None
        self.caller = ""
        self.refusal: web.Response | None = None
        self.body: bytearray | None = None
        self.body_bytes = 0
        self.declared = -1  # Content-Length; -1 when chunked

    def on_message_begin(self) -> None:
        self._begin()
        self.door.connections.busy(self)
        self.phase, self.since = HEAD, time.monotonic()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value)  # _count, inline: a call per header
        if self.head_bytes > self.limits.max_header_bytes:
            raise _Refused(json_error(431, "431: Request Header Fields Too Large"), linger=False)
        if len(self.header_list) >= self.limits.max_headers:
            raise _Refused(
                json_error(431, f"431: more than {self.limits.max_headers} header fields"),
                linger=False,
            )
        self.header_list.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self.received = self.loop.time()
        headers = self.headers = CIMultiDictProxy(CIMultiDict(self.header_list))
        length = headers.get("Content-Length", "")
        chunked = "chunked" in headers.get("Transfer-Encoding", "").lower()
        self.declared = int(length) if length.isdigit() and not chunked else -1
        self.method = self.parser.get_method().decode("ascii", "replace")
        url = self.url
        if url[:1] == b"/" and not any(c in url for c in (b"?", b"#", b"%")):
            self.path = url.decode("latin-1")  # a plain path, as most are: nothing to undo
        else:
            self.path = unquote(httptools.parse_url(url).path.decode("latin-1"))
        decision = self.door.decide(
            self.method, self.path, headers, max(self.declared, 0), self.client
        )
        if isinstance(decision, web.Response):
            if chunked or self.declared > 0:  # a body announced: it stays unread
                raise _Refused(decision)
            self.refusal = decision  # answered in turn; the connection stays
            return
        self.route, self.match_info, self.admitted, self.caller = decision
        if self.declared > 0 or chunked:
            # Grown as bytes arrive (realloc of a large block remaps, it does not copy):
            # a declared size is a promise, and zeroing it up front took the loop 100 ms.
            self.body = bytearray()
            self.phase, self.since = BODY, time.monotonic()
        if headers.get("Expect", "").lower() == "100-continue" and self.transport:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, chunk: bytes) -> None:
        if self.body is None:
            return
        n = len(chunk)
        if self.declared < 0:  # chunked: counted before it is kept
            assert self.route is not None
            if self.body_bytes + n > self.route.max_body:
                raise _Refused(
                    json_error(413, f"413: the body exceeds {self.route.max_body} bytes")
                )
            if self.admitted is not None:
                try:
                    self.admitted.grow(self.body_bytes + n)
                except ServeError as exc:
                    raise _Refused(error_response(exc)) from None
        self.body += chunk
        self.body_bytes += n

    def on_message_complete(self) -> None:
        self.phase = SERVING
        keep_alive = self.parser.should_keep_alive()
        if self.refusal is not None or self.route is None:
            self.waiting.append(
                (self.refusal or json_error(400, "400: Bad Request"), not keep_alive)
            )
        else:
            request = Request(self.method, self.url.decode("latin-1"), self.headers,
                              self.match_info, self.admitted, self.received)  # fmt: skip
            if self.body is not None:
                request._body = self.body
            request.remote, request.caller = self.client, self.caller
            self.waiting.append((request, self.route.handler, self.path, keep_alive))
        self.admitted = None  # the queued request holds it now
        self._start_serving()

    def _count(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > self.limits.max_header_bytes:
            raise _Refused(json_error(431, "431: Request Header Fields Too Large"), linger=False)

    # --- answering --------------------------------------------------------------------------

    def _start_serving(self) -> None:
        if not self.busy:
            self.busy = True
            self.loop.create_task(self._serve())

    async def _serve(self) -> None:
        try:
            while self.waiting and self.transport is not None:
                if self.drained is not None:
                    await self.drained
                    if self.transport is None:
                        return
                work = self.waiting.popleft()
                if not self.reading and not self.stopped:
                    self._resume_reading()
                if not await self._answer(work):
                    return
        finally:
            self.busy = False
        if not self.stopped and self.transport is not None and self.phase == SERVING:
            self._idle()  # and no next request has begun

    async def _answer(self, work: _Work) -> bool:
        """Write one answer; False when the connection is over."""
        if len(work) == 2:
            refusal, close = work
            self._write(refusal, keep_alive=not close, head=False)
            return not close
        request, handler, path, keep_alive = work
        try:
            response = await self.door.handle(handler, request, path)
        finally:
            if request.admitted is not None:
                request.admitted.release()
        if self.transport is None or self.transport.is_closing():
            return False  # the client left: its answer has no one to go to
        self._write(response, keep_alive, request.method == "HEAD")
        return keep_alive

    def _write(self, response: Reply, keep_alive: bool, head: bool) -> None:
        assert self.transport is not None
        try:
            data = encode(response, keep_alive, head)
        except Exception:  # a bug must not leave the client waiting
            log.exception("a response could not be written")
            data, keep_alive = (
                encode(json_error(500, "500 Internal Server Error"), False, False),
                False,
            )
        if len(data) == 1:
            self.transport.write(data[0])
        else:
            self.transport.writelines(data)
        if not keep_alive:
            if self.linger:
                self._linger()
            else:
                self.transport.close()

    def _stop(self, response: web.Response, linger: bool = False) -> None:
        """Answer `response` after what is queued, then close; parse nothing more.
        `linger`: a body was left unread; discard what the client still sends for
        LINGER_S before closing, so it reads the refusal instead of a reset (nginx's
        lingering close)."""
        self.stopped = True
        self.linger = linger
        self.phase = SERVING
        self._pause_reading()
        if self.admitted is not None:
            self.admitted.release()
            self.admitted = None
        self.waiting.append((response, True))
        self._start_serving()

    # --- deadlines --------------------------------------------------------------------------

    def _linger(self) -> None:
        self._resume_reading()
        self.phase, self.since = LINGER, time.monotonic()

    def _idle(self) -> None:
        self.door.connections.idle(self, self.client)
        self.phase, self.since = IDLE, time.monotonic()

    def check_deadline(self, now: float) -> None:
        """Called by the door's sweep: end what has run past its deadline. Deadlines
        run from when the phase began, so bytes arriving never extend them."""
        if self.transport is None:
            return
        late = now - self.since
        limits = self.limits
        if self.phase == IDLE:
            if late > limits.keepalive_timeout_s and not self.busy and not self.waiting:
                METRICS.door_refusals.labels(door="http", reason="keepalive_timeout").inc()
                self.transport.close()
        elif self.phase == HEAD:
            if late > limits.header_timeout_s:
                METRICS.door_refusals.labels(door="http", reason="header_timeout").inc()
                self._stop(json_error(408, "408: the request's headers took too long"))
        elif self.phase == BODY:
            # A declared size sets the time allowed; a chunked body earns it as it comes.
            size = self.declared if self.declared >= 0 else self.body_bytes
            if late > limits.body_timeout_s + size / limits.body_min_rate:
                METRICS.door_refusals.labels(door="http", reason="body_timeout").inc()
                self._stop(json_error(408, "408: the request's body arrived too slowly"))
        elif self.phase == LINGER and late > LINGER_S:
            self.transport.close()

    def _pause_reading(self) -> None:
        if self.reading and self.transport is not None:
            self.transport.pause_reading()
            self.reading = False

    def _resume_reading(self) -> None:
        if not self.reading and self.transport is not None:
            self.transport.resume_reading()
            self.reading = True


_NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())


class _Refused(Exception):
    """Raised from a parser callback: answer this, then close (lingering when a body
    was left unread)."""

    def __init__(self, response: web.Response, linger: bool = True) -> None:
        super().__init__(response.text)
        self.response, self.linger = response, linger


class NativeHttp:
    """The running door: `cleanup` stops it, as aiohttp's AppRunner's does."""

    def __init__(self, server: asyncio.AbstractServer, door: Door) -> None:
        self._server, self._door = server, door

    async def cleanup(self) -> None:
        self._door.stop_sweeping()
        self._server.close()
        for conn in list(self._door.open):
            if conn.transport is not None:
                conn.transport.close()
        await self._server.wait_closed()


async def start_native_http(
    table: list[Route], credentials: Credentials, gate: InflightGate, limits: DoorSettings,
    host: str, port: int, ssl: SSLContext | None,
) -> tuple[NativeHttp, int]:  # fmt: skip
    door = Door(Routes(table), credentials, gate, limits)
    door.start_sweeping()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(door), host, port, ssl=ssl, backlog=1024)
    bound = server.sockets[0].getsockname()[1] if server.sockets else port
    return NativeHttp(server, door), bound
