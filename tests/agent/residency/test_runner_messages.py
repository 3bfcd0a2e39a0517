"""What the effects ask a runner for a model, as pure functions: a staged copy per
provider, and each model's device and arena in its load."""

from __future__ import annotations

from pathlib import Path

from edgeplex.agent.catalog.model_config import ModelConfig
from edgeplex.agent.catalog.repository import ModelSource
from edgeplex.agent.residency.runner_messages import load_message, stage_message, staged_dir
from edgeplex.agent.residency.state import ModelKey, ModelRecord
from edgeplex.agent.runners.sessions import providers, session_options
from edgeplex.agent.runners.settings import RunnerSettings


def record(**config: object) -> ModelRecord:
    source = ModelSource(
        "m", "1", Path("repo/m/1/model.onnx"), ModelConfig(**config), digest="ab" * 32
    )
    return ModelRecord(ModelKey("m", "1"), source)


def test_each_provider_keeps_its_own_staged_copy():
    root = Path("staging")
    cpu = staged_dir(root, record(), "", "cpu")
    cuda = staged_dir(root, record(), "", "cuda")
    assert cpu == root / "m" / "1" / ("ab" * 8)  # as before providers had copies of their own
    assert cuda != cpu and cuda.name.endswith("-cuda")
    assert staged_dir(root, record(), "int8", "cuda").name.endswith("-int8-cuda")


def test_a_load_carries_the_models_device_arena_and_the_fallback_rule():
    settings = RunnerSettings(execution_provider="cuda", device_id=1, cpu_fallback=True)
    plain, _ = load_message(7, record(), "", False, Path("s"), settings)
    assert (plain.provider, plain.device_id, plain.arena) == ("cuda", 1, "kSameAsRequested")
    assert plain.cpu_fallback
    own, _ = load_message(
        8, record(device_id=3, gpu_arena="next_power_of_two"), "", True, Path("s"), settings
    )
    assert (own.device_id, own.arena, own.warm_up) == (3, "kNextPowerOfTwo", False)
    staged = stage_message(9, record(device_id=3), "", Path("s"), settings)
    assert (staged.provider, staged.device_id) == ("cuda", 3)


def test_a_load_carries_the_onnxruntime_parameters_as_ort_names_them():
    source = ModelSource(
        "m", "1", Path("repo/m/1/model.onnx"), ModelConfig(), digest="ab" * 32,
        ort_parameters=(("cudnn_conv_algo_search", "1"), ("enable_mem_pattern", "0"),
                        ("gpu_mem_limit", "1024"), ("inter_op_thread_count", "3")),
    )  # fmt: skip
    load, _ = load_message(1, ModelRecord(ModelKey("m", "1"), source), "", False, Path("s"),
                           RunnerSettings(execution_provider="cuda"))  # fmt: skip
    assert load.inter_op_threads == 3
    assert load.ort_session == {"enable_mem_pattern": "0"}
    assert load.cuda_options == {"cudnn_conv_algo_search": "HEURISTIC", "gpu_mem_limit": "1024"}
    options = session_options(load)
    assert (options.inter_op_num_threads, options.enable_mem_pattern) == (3, False)
    cuda = dict(providers(load)[0][1])
    assert (cuda["cudnn_conv_algo_search"], cuda["gpu_mem_limit"]) == ("HEURISTIC", "1024")
