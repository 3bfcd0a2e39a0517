"""Fuzzing load: generated requests, valid and malformed mixed, against a live agent.

Each request is drawn from a fixed-seed generator: valid JSON and binary
requests, and malformed ones of every kind the parser must refuse (random
bytes, deep nesting, huge or negative shapes, wrong field types, binary sizes
that overrun the body, bad or truncated gzip, JSON above its cap, unknown
models and versions). `--clients` callers that never pause send them over HTTP
keep-alive. Reported: requests per second, answers by status class, the count
of 5xx (goal: 0), and the agent's peak RSS growth over the run, runners
included (goal: bounded, under 200 MB).

    python bench/fuzz.py [--requests 20000 --clients 8 --seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import platform
import random
import sys
import tempfile
import time
import zlib
from collections import Counter
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Agent

from edgeplex.agent.catalog import demo

WIDTH = 16


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and its descendants (the agent and its runners)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(stat[1]), []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
        todo.extend(children.get(current, []))
    return total


def valid_doc(rng: random.Random) -> dict:
    rows = rng.randint(1, 4)
    return {
        "inputs": [
            {"name": n, "shape": [rows, WIDTH], "datatype": "FP32", "data": [1.0] * rows * WIDTH}
            for n in ("INPUT0", "INPUT1")
        ]
    }


def junk(rng: random.Random) -> object:
    return rng.choice([None, True, -1, 2**70, 1.5, "x", [], {}, [[[]]], {"a": [1]}, "9" * 40])


def generate(rng: random.Random) -> tuple[str, bytes, dict[str, str], str]:
    """(path, body, headers, kind) of one request."""
    path, headers = "/v2/models/add_sub/infer", {}
    kind = rng.choice(
        ["valid", "valid-binary", "valid-gzip", "bytes", "nesting", "shape", "types",
         "binary-size", "bad-gzip", "json-cap", "unknown-model", "field"]
    )  # fmt: skip
    doc = valid_doc(rng)
    body = b""
    if kind == "valid-binary" or kind == "binary-size":
        rows = doc["inputs"][0]["shape"][0]
        raw = bytes(rows * WIDTH * 4)
        for item in doc["inputs"]:
            del item["data"]
            item["parameters"] = {"binary_data_size": len(raw)}
        if kind == "binary-size":
            doc["inputs"][1]["parameters"]["binary_data_size"] = rng.choice([-1, 10**9, 3])
        header = json.dumps(doc).encode()
        headers["Inference-Header-Content-Length"] = str(len(header))
        body = header + raw + raw
    elif kind == "bytes":
        body = rng.randbytes(rng.randint(0, 512))
    elif kind == "nesting":
        body = b"[" * rng.choice([100, 10_000, 100_000])
    elif kind == "shape":
        doc["inputs"][0]["shape"] = rng.choice([[0, 10**30], [-1, 16], [2**62, 2**62], [1] * 40])
    elif kind == "types":
        doc[rng.choice(["inputs", "outputs", "parameters", "id"])] = junk(rng)
    elif kind == "field":
        doc["inputs"][rng.randint(0, 1)][rng.choice(["name", "shape", "datatype", "data"])] = junk(
            rng
        )
    elif kind == "bad-gzip":
        headers["Content-Encoding"] = "gzip"
        body = gzip.compress(json.dumps(doc).encode())[: rng.randint(0, 30)]
    elif kind == "json-cap":
        headers["Content-Encoding"] = "gzip"
        body = gzip.compress(b" " * (9 << 20) + json.dumps(doc).encode(), 1)
    elif kind == "unknown-model":
        path = rng.choice(["/v2/models/nope/infer", "/v2/models/add_sub/versions/7/infer"])
    if not body:
        body = json.dumps(doc).encode()
        if kind == "valid-gzip":
            headers["Content-Encoding"] = rng.choice(["gzip", "deflate"])
            body = (
                gzip.compress(body)
                if headers["Content-Encoding"] == "gzip"
                else zlib.compress(body)
            )
    return path, body, headers, kind


async def run(http: str, requests: list, clients: int) -> tuple[Counter, Counter, float]:
    statuses: Counter = Counter()
    fives: Counter = Counter()
    pending = iter(requests)
    started = time.perf_counter()

    async def caller(session: aiohttp.ClientSession) -> None:
        for path, body, headers, kind in pending:
            async with session.post(f"http://{http}{path}", data=body, headers=headers) as reply:
                await reply.read()
            statuses[f"{reply.status // 100}xx"] += 1
            if reply.status >= 500:
                fives[f"{reply.status} {kind}"] += 1

    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=120)
    # auto_decompress off: bodies are sent as generated, encodings included.
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(caller(session) for _ in range(clients)))
    return statuses, fives, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    requests = [generate(rng) for _ in range(args.requests)]
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        demo.make_add_sub(repo / "add_sub", config="max_batch_size: 16\n")
        agent = Agent(repo)
        try:
            before = tree_rss(agent.proc.pid)
            peak = before
            stop = False

            async def sample() -> None:
                nonlocal peak
                while not stop:
                    peak = max(peak, tree_rss(agent.proc.pid))
                    await asyncio.sleep(0.5)

            async def both() -> tuple[Counter, Counter, float]:
                nonlocal stop
                sampler = asyncio.create_task(sample())
                try:
                    return await run(agent.http, requests, args.clients)
                finally:
                    stop = True
                    await sampler

            statuses, fives, elapsed = asyncio.run(both())
            alive = agent.proc.poll() is None and agent.get("/v2/health/ready")[0] == 200
        finally:
            agent.stop()
    kinds = Counter(kind for *_, kind in requests)
    print(
        f"# fuzz: {args.requests} requests ({len(kinds)} kinds, seed {args.seed}), "
        f"{args.clients} closed-loop clients, HTTP keep-alive; "
        f"{platform.machine()}, Python {platform.python_version()}"
    )
    print("| requests | req/s | 2xx | 4xx | 5xx | RSS before | peak RSS growth | serving after |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print(
        f"| {sum(statuses.values())} | {sum(statuses.values()) / elapsed:.0f} "
        f"| {statuses['2xx']} | {statuses['4xx']} | {statuses['5xx']} "
        f"| {before / 2**20:.0f} MiB | {(peak - before) / 2**20:.0f} MiB | {alive} |"
    )
    if fives:
        print("5xx by kind:", dict(fives))


if __name__ == "__main__":
    main()
