"""Forwarding: proxying a request to the peer site the routing policy chose
(routing.py), from the routing table the control plane publishes for this
region (`edgeplex/v1/regions/<region>/routes`, nearest site first).

`Router` keeps the routes and the peers that failed recently, answers
`peers_for` with what the policy needs, and runs the two proxies. The core
(`Agent.route`) makes the decision once for both front doors. A question about
a model this site does not know (its metadata, config or readiness) goes to the
nearest peer that holds it too (`ask_http`, `ask_grpc`), so a client can
describe a model at any site that would forward its requests.

Every inference response names the site that served it in `edgeplex-served-by`
(an HTTP header or a gRPC trailer); a forwarded response carries the peer's.
The forwarder sends `edgeplex-origin-region` so the peer accounts the demand
to the region it came from, and the fleet's peer token; a site honours the hop
headers only from a caller that presents that token (`hop`). A peer that fails
to connect, or that leaves what was sent to it unacknowledged for
PEER_SILENCE_S (a cut link, on a connection kept from an earlier forward), is
skipped for PEER_BACKOFF_S and the next one is tried. So is a peer that is
reachable but hung (its process stopped, its loop stuck: its kernel still
accepts and acknowledges, so no timeout of TCP's fires): a forward it has not
answered in PROBE_AFTER_S has the peer asked whether it is live (a gRPC
ServerLive, at most one in flight per peer, answered from the peer's event
loop); no answer in PROBE_TIMEOUT_S and the forward goes to the next peer. A
peer that answers is only slow (a long inference), and the forward waits on.
A peer that
answers `edgeplex-not-here` (the routes reached this site before the model did, or
after it left) is dropped from the model's routes until the next table, and the
request is routed again (`StaleRoute`): a stale table costs a hop, never a request.
A peer that answers `edgeplex-sequence-not-here` holds the model but not the
request's sequence, begun at another holder: the model's other holders are tried
too, busy ones included (the route leaves those out, but the sequence's state may
be at one), nearest first and at most SEQUENCE_SEARCH in all; when none has it,
the caller has the peer's error. The holder that served a sequence's request is
remembered (at most SEQUENCES_KEPT sequences, the least recently used forgotten
first; a sequence's END forgets it), and its next requests go there first, busy
or not: a sequence whose holder is busy costs no search after the first.

Owned by the agent's event loop: routes are replaced by the fleet link, read
by the core; connections to peers are cached per address.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import socket
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
import grpc
from aiohttp.connector import AddrInfoType
from google.protobuf.message import Message

from edgeplex.agent.fleet.routing import PeerOption
from edgeplex.agent.oip.errors import DeadlineExceeded, ServeError, StaleRoute, Unavailable
from edgeplex.names import valid_name
from edgeplex.net import grpc_silence_options, silent_peer_socket
from edgeplex.proto import edgeplex_control_pb2 as cpb
from edgeplex.proto import inference_pb2 as pb
from edgeplex.proto import inference_pb2_grpc as pb_grpc

FORWARDED = "edgeplex-forwarded"
SERVED_BY = "edgeplex-served-by"
ORIGIN_REGION = "edgeplex-origin-region"
NOT_HERE = "edgeplex-not-here"  # on a 503: this site does not hold the model
# On a 400 / INVALID_ARGUMENT: this site holds the model, not the request's sequence.
SEQUENCE_NOT_HERE = "edgeplex-sequence-not-here"
# A forwarding peer proves it is one: the fleet's peer token, from the signed
# desired state. Only then are the two hop headers above honoured.
PEER_TOKEN = "edgeplex-peer-token"
TENANT_HEADER = "edgeplex-tenant"  # whom a forward is served for (with the peer token)
T = TypeVar("T")
PEER_BACKOFF_S = 5.0
PEER_CONNECT_TIMEOUT_S = 2.0
# Bytes sent to a peer and not acknowledged for this long close the connection
# (TCP_USER_TIMEOUT): a link cut under a kept connection fails the forward now, not
# at its deadline. Acknowledgement is the peer's kernel's, so a long inference at a
# live peer is not cut; several retransmissions fit in it at WAN round trips.
PEER_SILENCE_S = 3.0
# A forward a peer has not answered this long has the peer asked whether it is live;
# no answer within PROBE_TIMEOUT_S and the peer is taken for hung.
PROBE_AFTER_S = 1.0
PROBE_TIMEOUT_S = 1.0
FORWARD_TIMEOUT_S = 30.0  # a gRPC forward, when the caller set no deadline
HTTP_FORWARD_TIMEOUT_S = 60.0  # an HTTP forward (its deadline is in the undecoded body)
ASK_TIMEOUT_S = 10.0  # a question about a model (metadata, config, readiness)
NO_ROUTE_RETRY_S = 2.0
ROUTE_ATTEMPTS = 3
PEERS_TRIED = 2  # peers a forward tries, when the first fails or no longer holds the model
SEQUENCE_SEARCH = 8  # holders a request in the middle of a sequence is tried at, at most
SEQUENCES_KEPT = 4096  # sequences whose holder is remembered
HINT_HEAD, HINT_TAIL = 16384, 4096  # where an HTTP request's sequence id is looked for
# Headers an HTTP forward passes through, both ways (lower case: header names are
# compared without regard to case, as HTTP requires).
HTTP_REQUEST_HEADERS = frozenset(
    ("content-type", "content-encoding", "inference-header-content-length")
)
# What the serving site says about how it served, passed back by either forward
# (HTTP headers, gRPC trailers) besides edgeplex-served-by.
PASSED_BACK = ("edgeplex-cold-start", "edgeplex-variant")
HTTP_RESPONSE_HEADERS = frozenset(
    ("content-type", "inference-header-content-length", SERVED_BY, *PASSED_BACK, "retry-after")
)


@dataclass(frozen=True)
class HttpForward:
    """An HTTP inference request to pass on to a peer as received (still encoded)."""

    model: str
    path: str
    body: bytes
    headers: Mapping[str, str]  # as received (copied only when passed on)


@dataclass(frozen=True)
class GrpcForward:
    """A gRPC ModelInfer request to pass on to a peer, with the gRPC deadline it has
    left (its `timeout` parameter travels in the request: the peer applies it as
    the model there allows)."""

    request: pb.ModelInferRequest
    timeout_s: float | None


@dataclass(frozen=True)
class SequenceHint:
    """Which sequence a request to forward belongs to, read without decoding it:
    (model, version, id), and whether it starts or ends the sequence."""

    key: tuple[str, str, str]
    start: bool
    end: bool


# A sequence's parameters in an HTTP request's JSON (its keys are unique in the
# request's top-level parameters; anywhere else they are an input's own, which no
# engine gives these names). A wrong hint costs one try, never the request. Each
# try at a match reads at most a few hundred bytes past its key (a uint64 or a
# string id of up to 256 characters), so a body made of keys is still read in
# linear time.
_HTTP_SEQUENCE_ID = re.compile(rb'"sequence_id"\s*:\s*(\d{1,20}(?!\d)|"(?:[^"\\]|\\.){1,256}")')
_HTTP_START = re.compile(rb'"sequence_start"\s*:\s*true')
_HTTP_END = re.compile(rb'"sequence_end"\s*:\s*true')


def sequence_hint(call: HttpForward | GrpcForward) -> SequenceHint | None:
    """The sequence `call` belongs to, or None (none, or not found cheaply)."""
    if isinstance(call, GrpcForward):
        request = call.request
        if "sequence_id" not in request.parameters:
            return None
        given = request.parameters["sequence_id"]
        kind = given.WhichOneof("parameter_choice")
        if kind == "string_param" and given.string_param:
            sequence = json.dumps(given.string_param)
        elif kind in ("int64_param", "uint64_param") and getattr(given, kind):
            sequence = str(getattr(given, kind))
        else:
            return None
        flags = request.parameters
        start = "sequence_start" in flags and flags["sequence_start"].bool_param
        end = "sequence_end" in flags and flags["sequence_end"].bool_param
        return SequenceHint((request.model_name, request.model_version, sequence), start, end)
    size = _json_length(call.headers, len(call.body))
    for part in _sequence_windows(call.body, size):
        found = _HTTP_SEQUENCE_ID.search(part) if b'"sequence_id"' in part else None
        if found is not None:
            break
    else:
        return None
    token = found.group(1)
    try:
        sequence = json.dumps(json.loads(token)) if token.startswith(b'"') else str(int(token))
    except ValueError:
        return None
    if sequence in ("0", '""'):
        return None
    _, _, after = call.path.partition("/versions/")
    version = after.split("/", 1)[0]
    start, end = _HTTP_START.search(part) is not None, _HTTP_END.search(part) is not None
    return SequenceHint((call.model, version, sequence), start, end)


def _sequence_windows(body: bytes, size: int) -> tuple[bytes, ...]:
    """Where an HTTP request's JSON (its first `size` bytes) names its sequence, if
    anywhere: its first HINT_HEAD bytes or its last HINT_TAIL (Triton's clients
    write the parameters after the inputs). The rest is not read: the hint costs
    the same for a request of any size."""
    if size <= HINT_HEAD + HINT_TAIL:
        return (body[:size],)
    return body[:HINT_HEAD], body[size - HINT_TAIL : size]


def _json_length(headers: Mapping[str, str], size: int) -> int:
    """How much of an HTTP body is its JSON: Inference-Header-Content-Length with
    the binary data extension, else all of it."""
    for name, value in headers.items():
        if name.lower() == "inference-header-content-length":
            return int(value) if value.isdigit() else 0
    return size


# What a peer answered, in the protocol the request came in: (status, body,
# headers) over HTTP, (response, trailers with the serving site first) over gRPC.
HttpReply = tuple[int, bytes, dict[str, str]]
GrpcReply = tuple[pb.ModelInferResponse, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Forwarded:
    """A request a peer served: its reply, in the request's own protocol."""

    reply: HttpReply | GrpcReply


class PeerHung(TimeoutError):
    """A peer left a forward unanswered and did not answer whether it is live."""


@dataclass(frozen=True)
class Peer:
    site_id: str
    address: str
    http_address: str
    latency_ms: float = 0.0
    headroom: float | None = None  # None: the site has not reported


class Router:
    def __init__(self, site_id: str, region: str, peer_ca: bytes | None = None) -> None:
        self.site_id = site_id
        self.region = region
        # Set: peers serve TLS (security.tls_cert) signed by this CA, and forwards use it.
        self._peer_ca = peer_ca
        self._ssl = ssl.create_default_context(cadata=peer_ca.decode()) if peer_ca else None
        self._routes: dict[str, list[Peer]] = {}
        self.version = 0
        self._down_until: dict[str, float] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._http: aiohttp.ClientSession | None = None
        self.forwarded = 0
        self.peer_token = ""  # from the signed desired state
        # Where each sequence forwarded lately went on: its holder's site id.
        self._sequences: OrderedDict[tuple[str, str, str], str] = OrderedDict()
        # Per peer, the liveness question in flight or last answered, and when asked.
        self._probes: dict[str, tuple[float, asyncio.Future[bool]]] = {}

    def hop(self, header: Callable[[str], str | None]) -> tuple[bool, str]:
        """(forwarded, origin region) from a request's hop headers: honoured only
        when it carries this fleet's peer token; from anyone else, (False, "")."""
        token = header(PEER_TOKEN)
        if not self.peer_token or not token:
            return False, ""
        if not hmac.compare_digest(token.encode(), self.peer_token.encode()):
            return False, ""
        origin = header(ORIGIN_REGION) or ""
        return header(FORWARDED) is not None, origin if valid_name(origin) else ""

    def _hop_headers(self, origin: str = "", tenant: str = "") -> tuple[tuple[str, str], ...]:
        """What every call to a peer carries: this hop (honoured with the peer token),
        the region the demand comes from, and the credential of `_as_peer`."""
        return (
            (FORWARDED, self.site_id),
            (ORIGIN_REGION, origin or self.region),
            (PEER_TOKEN, self.peer_token),
            *self._as_peer(tenant),
        )

    def _as_peer(self, tenant: str) -> tuple[tuple[str, str], ...]:
        """The credential of a forward (the fleet's peer token, which the serving
        site's doors accept) and the tenant it is served for."""
        if not self.peer_token:
            return ()
        return (("authorization", f"Bearer {self.peer_token}"), (TENANT_HEADER, tenant))

    def update(self, routes: cpb.Routes) -> bool:
        """Replace the table unless `routes` is stale or for another region."""
        if routes.region != self.region or routes.version <= self.version:
            return False
        self.version = routes.version
        self._routes = {
            r.model: [
                Peer(
                    t.site_id,
                    t.address,
                    t.http_address,
                    t.latency_ms,
                    t.headroom if t.HasField("headroom") else None,
                )
                for t in r.targets
            ]
            for r in routes.routes
        }
        return True

    def holders(self, model: str) -> list[Peer]:
        """The peers holding `model` that are not this site and not backed off,
        nearest first (the table's order)."""
        now = time.monotonic()
        return [
            p
            for p in self._routes.get(model, ())
            if p.site_id != self.site_id and self._down_until.get(p.site_id, 0.0) <= now
        ]

    def options(self, model: str) -> list[PeerOption]:
        """`holders`, as the routing policy reads them (0 ms is a peer in this region,
        the nearest there is, not an unknown distance)."""
        return [PeerOption(p.site_id, p.latency_ms / 1000, p.headroom) for p in self.holders(model)]

    def peers(self, model: str, site_ids: tuple[str, ...]) -> list[Peer]:
        by_id = {p.site_id: p for p in self._routes.get(model, ())}
        return [by_id[s] for s in site_ids if s in by_id]

    def drop(self, model: str, peer: Peer) -> None:
        """`peer` answered that it does not hold `model`: off its routes until the
        next table arrives."""
        held = self._routes.get(model)
        if held is not None:
            self._routes[model] = [p for p in held if p.site_id != peer.site_id]

    def peer_failed(self, peer: Peer) -> None:
        self._down_until[peer.site_id] = time.monotonic() + PEER_BACKOFF_S

    async def _unless_hung(self, peer: Peer, attempt: Awaitable[T]) -> T:
        """What `attempt` (a forward to `peer`) gives; PeerHung, with the attempt
        cancelled and the peer skipped for PEER_BACKOFF_S, when it is unanswered
        PROBE_AFTER_S and the peer then does not answer whether it is live."""
        task = asyncio.ensure_future(attempt)
        try:
            while True:
                done, _ = await asyncio.wait((task,), timeout=PROBE_AFTER_S)
                if done:
                    return task.result()
                if not await self._live(peer):
                    self.peer_failed(peer)
                    raise PeerHung(f"site '{peer.site_id}' did not answer whether it is live")
        finally:
            task.cancel()  # (done: no effect)

    async def _live(self, peer: Peer) -> bool:
        """Whether `peer` answers a liveness question (any status is an answer) within
        PROBE_TIMEOUT_S. Forwards waiting on one peer share one question a period."""
        now = time.monotonic()
        asked = self._probes.get(peer.site_id)
        if asked is None or now - asked[0] >= PROBE_AFTER_S:
            asked = (now, asyncio.ensure_future(self._ask_live(peer)))
            self._probes[peer.site_id] = asked
        return await asyncio.shield(asked[1])

    async def _ask_live(self, peer: Peer) -> bool:
        try:
            await self._stub(peer).ServerLive(pb.ServerLiveRequest(), timeout=PROBE_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            return exc.code() not in (
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.UNAVAILABLE,
            )
        return True

    # --- the two proxies ------------------------------------------------------------------

    async def forward(
        self,
        call: HttpForward | GrpcForward,
        peers: list[Peer],
        origin: str,
        traceparent: str,
        tenant: str = "",
    ) -> HttpReply | GrpcReply:
        """Pass `call` on to the first of `peers` that holds its model, in its own
        protocol, for `tenant` (the serving site applies its limits). Raises
        StaleRoute when every peer tried said it does not hold it, and a peer's gRPC
        error as a ServeError with the same status. A request of a sequence goes
        first to the holder that served the sequence last."""
        hint = sequence_hint(call)
        if hint is not None:
            peers = self._holder_first(hint, peers)
        if isinstance(call, HttpForward):
            http = await self.forward_http(
                call.model, call.path, call.body, call.headers, peers, origin, traceparent, tenant
            )
            if hint is not None and http[0] == 200:
                self._remember(hint, http[2][SERVED_BY])
            return http
        try:
            response, trailers = await self.forward_grpc(
                call.request, peers, origin, call.timeout_s, traceparent, tenant
            )
        except grpc.aio.AioRpcError as exc:
            raise peer_error(exc) from None
        if hint is not None:
            self._remember(hint, trailers[0][1])  # (SERVED_BY, site) first
        return response, trailers

    def _holder_first(self, hint: SequenceHint, peers: list[Peer]) -> list[Peer]:
        """`peers`, with the site that served the sequence last first (busy or not;
        not when it is down or no longer on the model's routes)."""
        site = None if hint.start else self._sequences.get(hint.key)
        if site is None:
            return peers
        self._sequences.move_to_end(hint.key)
        if self._down_until.get(site, 0.0) > time.monotonic():
            return peers
        holder = next((p for p in self._routes.get(hint.key[0], ()) if p.site_id == site), None)
        if holder is None:
            return peers
        return [holder, *(p for p in peers if p.site_id != site)]

    def _remember(self, hint: SequenceHint, site: str) -> None:
        """The sequence went on at `site` (an END forgets it)."""
        if hint.end:
            self._sequences.pop(hint.key, None)
            return
        self._sequences[hint.key] = site
        self._sequences.move_to_end(hint.key)
        if len(self._sequences) > SEQUENCES_KEPT:
            self._sequences.popitem(last=False)

    async def forward_grpc(
        self,
        request: pb.ModelInferRequest,
        peers: list[Peer],
        origin: str,
        timeout_s: float | None,
        traceparent: str = "",
        tenant: str = "",
    ) -> tuple[pb.ModelInferResponse, tuple[tuple[str, str], ...]]:
        """(response, serving site), all within `timeout_s`. Raises StaleRoute when
        every peer tried said it does not hold the model, else grpc.aio.AioRpcError
        from the last peer (for a request in the middle of a sequence none of the
        holders has, the last one's; when one did not answer, its), or
        DeadlineExceeded when no peer could be asked in time."""
        metadata = self._hop_headers(origin, tenant) + (
            (("traceparent", traceparent),) if traceparent else ()
        )
        last: grpc.aio.AioRpcError | None = None
        miss: grpc.aio.AioRpcError | None = None  # a holder without the sequence
        stale = False
        tries = _Tries(self, request.model_name, peers, timeout_s or FORWARD_TIMEOUT_S)
        for peer in tries:
            call = self._stub(peer).ModelInfer(request, metadata=metadata, timeout=tries.left_s())
            try:
                response = await self._unless_hung(peer, call)
            except PeerHung as exc:
                call.cancel()
                last, tries.unanswered = None, exc
                continue
            except grpc.aio.AioRpcError as exc:
                last = exc
                marks = {key for key, _ in exc.trailing_metadata() or ()}
                if NOT_HERE in marks:
                    self.drop(request.model_name, peer)
                    stale = True
                    continue
                if SEQUENCE_NOT_HERE in marks:
                    miss = exc
                    tries.search()
                    continue
                if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    self.peer_failed(peer)
                    tries.unanswered = exc
                    continue
                raise
            trailers = dict(await call.trailing_metadata() or ())
            self.forwarded += 1
            served_by = str(trailers.get(SERVED_BY, peer.site_id))
            passed = tuple((k, str(trailers[k])) for k in PASSED_BACK if k in trailers)
            return response, ((SERVED_BY, served_by), *passed)
        hung = tries.unanswered if isinstance(tries.unanswered, PeerHung) else None
        if miss is not None:
            if tries.searched_all:  # every holder answered: none has the sequence
                raise miss
            if hung is not None:
                raise _hung_error(hung)
            raise tries.unanswered or tries.past_deadline()
        if stale:
            raise StaleRoute(request.model_name)
        if last is None and hung is not None:  # the last peer tried was hung
            raise _hung_error(hung)
        raise last or tries.past_deadline()

    async def forward_http(
        self,
        model: str,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        peers: list[Peer],
        origin: str,
        traceparent: str = "",
        tenant: str = "",
        timeout_s: float = HTTP_FORWARD_TIMEOUT_S,
    ) -> tuple[int, bytes, dict[str, str]]:
        """(status, body, headers) of the first peer that answers and holds `model`
        (for a request in the middle of a sequence none of them has: the last one's
        answer), all within `timeout_s`. Raises StaleRoute when every peer tried said
        it does not hold it, DeadlineExceeded when a search for the sequence ran out of
        time, and Unavailable when no peer answered."""
        session = self._session()
        out = {k: v for k, v in headers.items() if k.lower() in HTTP_REQUEST_HEADERS}
        out.update(self._hop_headers(origin, tenant))
        if traceparent:
            out["traceparent"] = traceparent  # this hop as the parent (access_log.py)
        stale = False
        miss: HttpReply | None = None  # a holder without the sequence: its answer
        tries = _Tries(self, model, peers, timeout_s)
        scheme = "https" if self._ssl else "http"

        async def post(peer: Peer) -> tuple[int, bytes, Mapping[str, str]]:
            async with session.post(
                f"{scheme}://{peer.http_address}{path}",
                data=body,
                headers=out,
                ssl=self._ssl if self._ssl else True,
                timeout=aiohttp.ClientTimeout(
                    total=tries.left_s(), sock_connect=PEER_CONNECT_TIMEOUT_S
                ),
            ) as reply:
                return reply.status, await reply.read(), reply.headers

        for peer in tries:
            try:
                status, payload, headers_back = await self._unless_hung(peer, post(peer))
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:  # PeerHung too
                self.peer_failed(peer)
                tries.unanswered = exc
                continue
            if status == 503 and NOT_HERE in headers_back:
                self.drop(model, peer)
                stale = True
                continue
            kept = {k: v for k, v in headers_back.items() if k.lower() in HTTP_RESPONSE_HEADERS}
            kept.setdefault(SERVED_BY, peer.site_id)
            if SEQUENCE_NOT_HERE in headers_back:
                miss = status, payload, kept
                tries.search()
                continue
            self.forwarded += 1
            return status, payload, kept
        if miss is not None:
            if tries.searched_all:  # every holder answered: none has the sequence
                return miss  # the last one's answer
            if tries.unanswered is None:  # cut short by the deadline
                raise tries.past_deadline()
        elif stale:
            raise StaleRoute(model)
        error = Unavailable(f"no peer answered for '{path}'; retry in {NO_ROUTE_RETRY_S:g} s")
        error.retry_after_s = NO_ROUTE_RETRY_S
        raise error

    # --- questions about a model: its metadata, config, readiness ------------------------

    async def ask_http(self, path: str, peers: list[Peer]) -> HttpReply:
        """The answer to a GET about a model (`path`: its metadata, config or
        readiness) from the first of `peers` that answers, as that peer gave it."""
        session = self._session()
        scheme = "https" if self._ssl else "http"
        headers = dict(self._hop_headers())
        for peer in peers[:PEERS_TRIED]:
            try:
                async with session.get(
                    f"{scheme}://{peer.http_address}{path}",
                    headers=headers,
                    ssl=self._ssl if self._ssl else True,
                    timeout=aiohttp.ClientTimeout(
                        total=ASK_TIMEOUT_S, sock_connect=PEER_CONNECT_TIMEOUT_S
                    ),
                ) as reply:
                    payload = await reply.read()
                    kept = {"content-type": reply.headers.get("content-type", "application/json")}
                    return reply.status, payload, kept | {SERVED_BY: peer.site_id}
            except (aiohttp.ClientConnectionError, TimeoutError):
                self.peer_failed(peer)
        error = Unavailable(f"no peer answered for '{path}'; retry in {NO_ROUTE_RETRY_S:g} s")
        error.retry_after_s = NO_ROUTE_RETRY_S
        raise error

    async def ask_grpc(self, method: str, request: Message, peers: list[Peer]) -> Message:
        """The answer to a unary call about a model (`method`: ModelMetadata,
        ModelConfig, ModelReady) from the first of `peers` that answers; a peer's
        error, such as NOT_FOUND, as a ServeError with its status."""
        metadata = self._hop_headers()
        last: grpc.aio.AioRpcError | None = None
        for peer in peers[:PEERS_TRIED]:
            try:
                answer: Message = await getattr(self._stub(peer), method)(
                    request, metadata=metadata, timeout=ASK_TIMEOUT_S
                )
                return answer
            except grpc.aio.AioRpcError as exc:
                last = exc
                if exc.code() not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ):
                    break
                self.peer_failed(peer)
        assert last is not None
        raise peer_error(last)

    def _stub(self, peer: Peer) -> pb_grpc.GRPCInferenceServiceStub:
        channel = self._channels.get(peer.address)
        if channel is None:
            options = grpc_silence_options(PEER_SILENCE_S)
            channel = self._channels[peer.address] = (
                grpc.aio.secure_channel(
                    peer.address, grpc.ssl_channel_credentials(self._peer_ca), options
                )
                if self._peer_ca
                else grpc.aio.insecure_channel(peer.address, options)
            )
        return pb_grpc.GRPCInferenceServiceStub(channel)

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            # A peer that does not accept the connection quickly is treated as down.
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(socket_factory=_peer_socket),
                timeout=aiohttp.ClientTimeout(
                    total=HTTP_FORWARD_TIMEOUT_S, sock_connect=PEER_CONNECT_TIMEOUT_S
                ),
            )
        return self._http

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        if self._http is not None:
            await self._http.close()


def _peer_socket(addr_info: AddrInfoType) -> socket.socket:
    family, kind, proto, _, _ = addr_info
    return silent_peer_socket(PEER_SILENCE_S, family, kind, proto)


class _Tries:
    """The peers a forward tries, in turn, all within one time budget: the first
    PEERS_TRIED the route names; once one answered that it holds the model but not
    the request's sequence (`search`), the model's other holders too, busy ones
    included, up to SEQUENCE_SEARCH in all."""

    def __init__(self, router: Router, model: str, peers: list[Peer], budget_s: float) -> None:
        self._router, self._model = router, model
        self._queue = list(peers[:PEERS_TRIED])
        self._tried: list[str] = []
        self._searching = False
        self._end = time.monotonic() + budget_s
        # The last peer that failed to answer (it may hold the request's sequence).
        self.unanswered: Exception | None = None

    def left_s(self) -> float:
        """The budget's seconds left (each try has no more)."""
        return self._end - time.monotonic()

    @property
    def searched_all(self) -> bool:
        """Every peer to try was tried, and each answered."""
        return not self._queue and self.unanswered is None

    def past_deadline(self) -> DeadlineExceeded:
        return DeadlineExceeded(f"model '{self._model}': the request's deadline passed")

    def __iter__(self) -> Iterator[Peer]:
        while self._queue and self.left_s() > 0:
            peer = self._queue.pop(0)
            self._tried.append(peer.site_id)
            yield peer

    def search(self) -> None:
        if self._searching:
            return
        self._searching = True
        named = set(self._tried) | {p.site_id for p in self._queue}
        rest = [p for p in self._router.holders(self._model) if p.site_id not in named]
        self._queue = (self._queue + rest)[: max(0, SEQUENCE_SEARCH - len(self._tried))]


async def via_peers(
    route: Callable[[], list[Peer]], send: Callable[[list[Peer]], Awaitable[T]]
) -> T | None:
    """Send the request to the peers `route` names; None: `route` says serve it here.
    When every peer tried answered that it does not hold the model, those peers are
    off the routes now: route again (at most ROUTE_ATTEMPTS times)."""
    for _ in range(ROUTE_ATTEMPTS):
        peers = route()
        if not peers:
            return None
        try:
            return await send(peers)
        except StaleRoute:
            continue
    raise Unavailable(f"routes are changing; retry in {NO_ROUTE_RETRY_S:g} s")


def _hung_error(exc: PeerHung) -> Unavailable:
    error = Unavailable(f"{exc}; retry in {NO_ROUTE_RETRY_S:g} s")
    error.retry_after_s = NO_ROUTE_RETRY_S
    return error


def peer_error(exc: grpc.aio.AioRpcError) -> ServeError:
    """A peer's gRPC error, passed on to our caller with the same status."""
    error = ServeError(exc.details() or exc.code().name)
    error.grpc_code = exc.code()
    error.http_status = 503 if exc.code() == grpc.StatusCode.UNAVAILABLE else 502
    if exc.code() == grpc.StatusCode.UNAVAILABLE:
        error.retry_after_s = NO_ROUTE_RETRY_S
    return error
