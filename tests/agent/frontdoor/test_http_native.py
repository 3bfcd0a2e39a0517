"""The native HTTP door speaks HTTP/1.1 as clients expect: keep-alive and pipelining
in order, chunked bodies, Expect, HEAD, 404/405, and clear refusals (400, 413, 431)
that close only the offending connection. Raw sockets against a real agent."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.conftest import start_agent
from tests.support.http1 import closed, read_response

BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [2.0] * 16},
        ]
    }
).encode()
INFER = "/v2/models/add_sub/infer"


@pytest.fixture(scope="module")
def agent(model_repo, tmp_path_factory):
    process = start_agent(
        model_repo,
        tmp_path_factory.mktemp("agent"),
        env={"EDGEPLEX_AGENT_HTTP_SERVER": "native", "EDGEPLEX_AGENT_MAX_PAYLOAD_BYTES": "1MiB"},
    )
    yield process
    assert process.stop() == 0, process.log()


def connect(agent) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", agent.http_port), timeout=10)
    return sock


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode()
        + body
    )


def test_pipelined_requests_are_answered_in_order_on_one_connection(agent):
    sock, buffer = connect(agent), bytearray()
    bad = json.dumps({"inputs": []}).encode()
    sock.sendall(post(INFER, BODY) + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
                 + post(INFER, bad) + post(INFER, BODY))  # fmt: skip
    statuses = [read_response(sock, buffer)[0] for _ in range(4)]
    assert statuses == [200, 200, 400, 200]
    sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")  # still open
    assert read_response(sock, buffer)[0] == 200


def test_chunked_bodies_expect_and_head(agent):
    sock, buffer = connect(agent), bytearray()
    half = len(BODY) // 2
    chunks = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, BODY[:half], len(BODY) - half,
                                                   BODY[half:])  # fmt: skip
    sock.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                 .encode() + chunks)  # fmt: skip
    status, _, body = read_response(sock, buffer)
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [3.0] * 16
    head = post(INFER, BODY, "Expect: 100-continue\r\n")[: -len(BODY)]
    sock.sendall(head)  # the headers alone, waiting for the go-ahead
    assert read_response(sock, buffer)[0] == 100
    sock.sendall(BODY)
    assert read_response(sock, buffer)[0] == 200
    sock.sendall(b"HEAD /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = read_response_head(sock, buffer)
    assert status == 200 and int(headers["content-length"]) > 0 and body == b""


def read_response_head(sock, buffer):
    """A HEAD response: headers only, whatever Content-Length says."""
    while b"\r\n\r\n" not in buffer:
        buffer += sock.recv(65536)
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    buffer[:] = rest
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), headers, b""


def test_unknown_paths_and_methods(agent):
    sock, buffer = connect(agent), bytearray()
    sock.sendall(b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(sock, buffer)[0] == 404
    sock.sendall(b"DELETE /v2/models/add_sub HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, _ = read_response(sock, buffer)
    assert status == 405 and headers["allow"] == "GET"


@pytest.mark.parametrize(
    "request_bytes, status",
    [
        (b"NOT HTTP AT ALL\r\n\r\n", 400),
        (post(INFER, b"", "").replace(b"Content-Length: 0", b"Content-Length: 99999999"), 413),
        (b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431),
    ],
)
def test_refusals_close_only_their_connection(agent, request_bytes, status):
    sock, buffer = connect(agent), bytearray()
    sock.sendall(request_bytes)
    got, headers, _ = read_response(sock, buffer)
    assert got == status and headers.get("connection") == "close"
    assert closed(sock)
    other, buffer = connect(agent), bytearray()  # the door still serves
    other.sendall(post(INFER, BODY))
    assert read_response(other, buffer)[0] == 200


def test_http10_and_connection_close_end_the_connection(agent):
    close = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    for request in (b"GET /v2/health/live HTTP/1.0\r\n\r\n", close):
        sock, buffer = connect(agent), bytearray()
        sock.sendall(request)
        assert read_response(sock, buffer)[0] == 200
        assert closed(sock)


def test_the_deadline_starts_when_the_headers_arrive(agent):
    """A body that arrives after the request's own timeout has passed (counted from
    its headers) is answered 504, not served as if it had just come."""
    doc = json.loads(BODY)
    doc["parameters"] = {"timeout": 200_000}  # µs
    body = json.dumps(doc).encode()
    request = post(INFER, body)
    head, tail = (
        request[: request.index(b"\r\n\r\n") + 4],
        request[request.index(b"\r\n\r\n") + 4 :],
    )
    with connect(agent) as sock:
        sock.sendall(head)
        time.sleep(0.4)  # the body comes late: twice the request's timeout
        sock.sendall(tail)
        status, _, payload = read_response(sock, bytearray())
    assert status == 504, payload
    with connect(agent) as sock:  # the same body, sent at once, is served
        sock.sendall(request)
        status, _, payload = read_response(sock, bytearray())
    assert status == 200, payload


def test_a_keep_alive_client_gets_every_large_answer(tmp_path):
    """An answer larger than the transport's buffer pauses writing, and reading with
    it; once the client has read it, its next request on the same connection is read
    and answered (it once waited for ever)."""
    from edgeplex.agent.catalog import demo

    width = 4 << 20  # 16 MiB in, 16 MiB out: past what the socket buffers hold
    demo.make_identity(tmp_path / "repo" / "identity", "FP32", width=width)
    big = start_agent(
        tmp_path / "repo", tmp_path,
        env={"EDGEPLEX_AGENT_HTTP_SERVER": "native", "EDGEPLEX_AGENT_MAX_PAYLOAD_BYTES": "64MiB"},
    )  # fmt: skip
    header = json.dumps({"inputs": [{"name": "INPUT", "shape": [1, width], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 4 * width}}],
                         "parameters": {"binary_data_output": True}}).encode()  # fmt: skip
    body = header + bytes(4 * width)
    extra = f"Inference-Header-Content-Length: {len(header)}\r\n"
    try:
        sock, buffer = connect(big), bytearray()
        for _ in range(3):
            sock.sendall(post("/v2/models/identity/infer", body, extra))
            status, _, answer = read_response(sock, buffer)
            assert status == 200 and len(answer) > 4 * width
    finally:
        assert big.stop() == 0, big.log()
