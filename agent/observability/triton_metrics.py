"""Triton's metric names, next to edgeplex's own, so that dashboards and alerts
written for Triton work on an agent unchanged.

Rendered straight from each model version's statistics (stats.py) in Triton's
shape: counters without a `_total` suffix, labelled `model` and `version`,
durations as cumulative microseconds, failures by `reason` (OTHER, BACKEND,
CANCELED, REJECTED), and `nv_inference_pending_request_count`, the requests
queued or waiting for their model's promotion (the gauge autoscalers and
inference gateways read). Appended to `/metrics` after the `edgeplex_*`
families. Where NVML answers (nvidia-ml-py installed, a GPU present), the GPU
gauges too: `nv_gpu_utilization` (0-1), `nv_gpu_memory_used_bytes` and
`nv_gpu_memory_total_bytes`, labelled `gpu_uuid`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from edgeplex.agent.observability.stats import FAILURE_REASONS, ModelStats

# (name, help, type, the samples of one model version: (reason, value) from its
# statistics and pending requests; a reason only on failures), in Triton's order.
_Samples = Callable[[ModelStats, int], list[tuple[str, int]]]
_FAMILIES: tuple[tuple[str, str, str, _Samples], ...] = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     "counter", lambda s, _: [("", s.success.count)]),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
     "counter", lambda s, _: [(r, s.failures.get(r, 0)) for r in FAILURE_REASONS]),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     "counter", lambda s, _: [("", s.inference_count)]),
    ("nv_inference_exec_count",
     "Number of model executions performed (does not include cached requests)",
     "counter", lambda s, _: [("", s.execution_count)]),
    ("nv_inference_request_duration_us",
     "Cumulative inference request duration in microseconds (includes cached requests)",
     "counter", lambda s, _: [("", s.success.ns // 1000)]),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds",
     "counter", lambda s, _: [("", s.queue.ns // 1000)]),
    ("nv_inference_compute_input_duration_us",
     "Cumulative compute input duration in microseconds",
     "counter", lambda s, _: [("", s.compute_input.ns // 1000)]),
    ("nv_inference_compute_infer_duration_us",
     "Cumulative compute inference duration in microseconds",
     "counter", lambda s, _: [("", s.compute_infer.ns // 1000)]),
    ("nv_inference_compute_output_duration_us",
     "Cumulative inference compute output duration in microseconds",
     "counter", lambda s, _: [("", s.compute_output.ns // 1000)]),
    ("nv_cache_num_hits_per_model", "Number of cache hits per model",
     "counter", lambda s, _: [("", s.cache_hit.count)]),
    ("nv_cache_hit_duration_per_model",
     "Total cache hit duration per model, in microseconds",
     "counter", lambda s, _: [("", s.cache_hit.ns // 1000)]),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model",
     "counter", lambda s, _: [("", s.cache_miss.count)]),
    ("nv_cache_miss_duration_per_model",
     "Total cache miss (insert+lookup) duration per model, in microseconds",
     "counter", lambda s, _: [("", s.cache_miss.ns // 1000)]),
    # Queued, or waiting for the model's promotion.
    ("nv_inference_pending_request_count",
     "Instantaneous number of pending requests awaiting execution per-model.",
     "gauge", lambda _, pending: [("", pending)]),
)  # fmt: skip


NAMES = tuple(name for name, _, _, _ in _FAMILIES)  # every family render() writes


def render(models: Iterable[tuple[str, str, ModelStats, int]]) -> str:
    """Prometheus text for every (model, version, statistics, pending requests)."""
    rows = list(models)
    out: list[str] = []
    for name, text, kind, samples in _FAMILIES:
        out.append(f"# HELP {name} {text}\n# TYPE {name} {kind}\n")
        for model, version, stats, pending in rows:
            for reason, value in samples(stats, pending):
                out.append(f"{name}{{{_labels(model, version, reason)}}} {value}\n")
    return "".join(out)


def _labels(model: str, version: str, reason: str = "") -> str:
    """Triton's label order: model, reason (failures only), version."""
    reason_label = f',reason="{reason}"' if reason else ""
    return f'model="{_escape(model)}"{reason_label},version="{_escape(version)}"'


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")


GpuReading = tuple[str, float, int, int]  # uuid, utilization 0-1, used bytes, total bytes
_GAUGES = (
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", 1),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", 3),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", 2),
)
_nvml: Any = None  # the module once NVML initialised; False once it failed


def gpu_readings() -> list[GpuReading]:
    """Every GPU NVML sees; [] without NVML or a GPU (checked once per process)."""
    global _nvml
    if _nvml is None:
        try:
            import pynvml

            pynvml.nvmlInit()
            _nvml = pynvml
        except Exception:  # not installed, no driver, no GPU
            _nvml = False
    if not _nvml:
        return []
    out = []
    try:
        for index in range(_nvml.nvmlDeviceGetCount()):
            handle = _nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _nvml.nvmlDeviceGetUUID(handle)
            util = _nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
            memory = _nvml.nvmlDeviceGetMemoryInfo(handle)
            out.append((str(uuid), util, int(memory.used), int(memory.total)))
    except Exception:  # a GPU lost mid-scrape: report what was read
        pass
    return out


def render_gpus(readings: list[GpuReading]) -> str:
    if not readings:
        return ""
    out: list[str] = []
    for name, text, field in _GAUGES:
        out.append(f"# HELP {name} {text}\n# TYPE {name} gauge\n")
        for reading in readings:
            out.append(f'{name}{{gpu_uuid="{_escape(reading[0])}"}} {reading[field]}\n')
    return "".join(out)
