"""The response cache: keys that tell requests apart, least recently used going
first within the budget; and, end to end, identical requests answered without
running the model or promoting it, counted as Triton counts cache hits."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th

from edgeplex.agent.catalog import demo
from edgeplex.agent.catalog.repository import scan_versions
from edgeplex.agent.config import ModelConfig
from edgeplex.agent.oip.response_cache import ResponseCache
from edgeplex.agent.residency.describe import describe
from tests.conftest import start_agent
from tests.support.agent import post, status
from tests.support.oip import inputs_for
from tests.support.sequences import make_two_slots


def key(inputs: dict[str, np.ndarray], wanted: list[str] | None = None, version: str = "1"):
    return ResponseCache.key("m", version, inputs, wanted)


def test_a_key_tells_apart_values_shapes_datatypes_outputs_and_versions():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    base = key({"x": x})
    assert key({"x": x.copy()}) == base
    assert key({"x": np.asfortranarray(x)}) == base  # the values, not their layout
    for other in (
        key({"x": x + 1}),
        key({"x": x.reshape(3, 2)}),
        key({"x": x.reshape(6)}),
        key({"x": x.astype(np.float64)}),
        key({"y": x}),
        key({"x": x, "y": x}),
        key({"x": x}, ["out"]),
        key({"x": x}, version="2"),
    ):
        assert other != base
    strings = np.array([b"ab", b"c"], dtype=object)
    assert key({"s": strings}) != key({"s": np.array([b"a", b"bc"], dtype=object)})
    assert key({"s": strings}) == key({"s": np.array([b"ab", b"c"], dtype=object)})


def test_answers_are_kept_read_only_least_recently_used_going_first():
    cache = ResponseCache(budget_bytes=8 * 400)  # an answer of 400 bytes is the most kept
    answers = {i: {"y": np.full(100, i, np.float32)} for i in range(9)}  # 400 bytes each
    for i in range(8):
        cache.put(key({"x": np.array([i])}), answers[i])
    assert len(cache) == 8 and cache.bytes == 3200
    assert cache.get(key({"x": np.array([0])})) is not None  # 0 is used: 1 is the oldest now
    cache.put(key({"x": np.array([8])}), answers[8])
    assert cache.get(key({"x": np.array([1])})) is None
    kept = cache.get(key({"x": np.array([8])}))
    assert kept is not None and not kept["y"].flags.writeable
    answers[8]["y"][:] = -1  # the caller's array changes: the kept copy does not
    assert float(kept["y"][0]) == 8.0
    cache.put(key({"x": np.array([9])}), {"y": np.zeros(101, np.float32)})  # over an eighth
    assert cache.get(key({"x": np.array([9])})) is None and cache.bytes == 3200


@pytest.mark.slow
def test_identical_requests_are_answered_from_the_cache_without_the_model(tmp_path):
    repo = tmp_path / "repo"
    demo.make_add_sub(repo / "cached")
    (repo / "cached" / "config.pbtxt").write_text(
        'name: "cached"\nmax_batch_size: 8\nresponse_cache { enable: true }\n'
    )
    demo.make_add_sub(repo / "plain")
    wide = 1 << 19  # 2 MiB an input: digested on a worker thread
    demo.make_add_sub(repo / "wide", width=wide, config="response_cache: true\n")
    agent = start_agent(repo, tmp_path)
    try:
        client = tg.InferenceServerClient(agent.grpc_url)
        a = np.arange(16, dtype=np.float32).reshape(1, 16)
        b = np.ones((1, 16), np.float32)
        first = client.infer("cached", inputs_for({"INPUT0": a, "INPUT1": b}))
        again = client.infer("cached", inputs_for({"INPUT0": a, "INPUT1": b}))
        np.testing.assert_array_equal(again.as_numpy("OUTPUT0"), first.as_numpy("OUTPUT0"))
        np.testing.assert_array_equal(again.as_numpy("OUTPUT1"), a - b)
        other = client.infer("cached", inputs_for({"INPUT0": b, "INPUT1": b}))
        np.testing.assert_array_equal(other.as_numpy("OUTPUT0"), b + b)
        stats = client.get_inference_statistics("cached").model_stats[0]
        assert stats.inference_stats.cache_hit.count == 1
        assert stats.inference_stats.cache_miss.count == 2
        assert stats.inference_stats.success.count == 3  # hits count as successes,
        assert stats.inference_count == 2 and stats.execution_count == 2  # not inferences
        # Demoted to host memory, the model answers a kept request as it is, unpromoted.
        assert post(agent, "/edgeplex/v1/models/cached/demote", {"tier": "staged"}) == 200
        http = th.InferenceServerClient(agent.http_url)
        feeds = [th.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        feeds[0].set_data_from_numpy(a)
        feeds[1].set_data_from_numpy(b)
        result = http.infer("cached", feeds)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        assert status(agent)["cached"]["tier"] == "staged"
        http_stats = http.get_inference_statistics("cached")["model_stats"][0]
        assert http_stats["inference_stats"]["cache_hit"]["count"] == 2
        http.close()  # here: a client left to the collector closes on whatever thread it runs
        # A model that does not enable the cache runs every request.
        for _ in range(2):
            client.infer("plain", inputs_for({"INPUT0": a, "INPUT1": b}))
        plain = client.get_inference_statistics("plain").model_stats[0]
        assert plain.execution_count == 2 and plain.inference_stats.cache_hit.count == 0
        big = np.random.default_rng(0).standard_normal((1, wide)).astype(np.float32)
        answers = [client.infer("wide", inputs_for({"INPUT0": big, "INPUT1": big}))
                   for _ in range(2)]  # fmt: skip
        np.testing.assert_array_equal(answers[1].as_numpy("OUTPUT0"), big + big)
        wide_stats = client.get_inference_statistics("wide").model_stats[0].inference_stats
        assert wide_stats.cache_hit.count == 1 and wide_stats.cache_miss.count == 1
        metrics = agent.http_get("/metrics")[1].decode()
        assert 'nv_cache_num_hits_per_model{model="cached",version="1"} 2' in metrics
        assert 'nv_cache_num_misses_per_model{model="cached",version="1"} 2' in metrics
        client.close()
    finally:
        assert agent.stop() == 0, agent.log()


def test_a_stateful_model_with_the_cache_fails_with_the_reason(tmp_path):
    make_two_slots(tmp_path / "repo" / "two_slots")
    (tmp_path / "repo" / "two_slots" / "config.yaml").write_text("response_cache: true\n")
    (source,) = scan_versions(tmp_path / "repo", "two_slots", ModelConfig())
    assert describe("two_slots", source) == (
        "the response cache does not support a model with sequence batching"
    )


@pytest.mark.slow
def test_a_replaced_model_file_answers_anew(tmp_path):
    """The same version, its model.onnx replaced and loaded again: the kept answer
    is not the new model's, and is not served."""
    repo = tmp_path / "repo"
    demo.make_mlp(repo / "m", width=16, layers=1, seed=0, config="response_cache: true\n")
    agent = start_agent(repo, tmp_path)
    try:
        client = tg.InferenceServerClient(agent.grpc_url)
        x = np.ones((1, 16), np.float32)
        before = client.infer("m", inputs_for({"input": x})).as_numpy("output")
        assert post(agent, "/edgeplex/v1/models/m/demote", {"tier": "cached"}) == 200
        demo.make_mlp(repo / "m", width=16, layers=1, seed=7, config="response_cache: true\n")
        assert post(agent, "/v2/repository/models/m/load") == 200
        after = client.infer("m", inputs_for({"input": x})).as_numpy("output")
        assert not np.array_equal(before, after)
        stats = client.get_inference_statistics("m").model_stats[0].inference_stats
        assert stats.cache_hit.count == 0 and stats.cache_miss.count == 2
    finally:
        assert agent.stop() == 0, agent.log()
