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

from collections.abc import Iterable
from typing import Any

from edgeplex.agent.observability.stats import FAILURE_REASONS, ModelStats

FAILURE = "nv_inference_request_failure"  # labelled by reason, as Triton does
PENDING = "nv_inference_pending_request_count"  # queued or waiting for a promotion

# (name, help, value of a model's statistics)
_COUNTERS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s.success.count),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     lambda s: s.inference_count),
    ("nv_inference_exec_count",
     "Number of model executions performed (does not include cached requests)",
     lambda s: s.execution_count),
    ("nv_inference_request_duration_us",
     "Cumulative inference request duration in microseconds (includes cached requests)",
     lambda s: s.success.ns // 1000),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds",
     lambda s: s.queue.ns // 1000),
    ("nv_inference_compute_input_duration_us",
     "Cumulative compute input duration in microseconds",
     lambda s: s.compute_input.ns // 1000),
    ("nv_inference_compute_infer_duration_us",
     "Cumulative compute inference duration in microseconds",
     lambda s: s.compute_infer.ns // 1000),
    ("nv_inference_compute_output_duration_us",
     "Cumulative inference compute output duration in microseconds",
     lambda s: s.compute_output.ns // 1000),
)  # fmt: skip


def render(models: Iterable[tuple[str, str, ModelStats, int]]) -> str:
    """Prometheus text for every (model, version, statistics, pending requests)."""
    rows = list(models)
    out: list[str] = []
    for name, text, value in _COUNTERS:
        out.append(f"# HELP {name} {text}\n# TYPE {name} counter\n")
        for model, version, stats, _ in rows:
            out.append(f"{name}{{{_labels(model, version)}}} {value(stats)}\n")
        if name == "nv_inference_request_success":  # Triton's order: failures next
            out.append(f"# HELP {FAILURE} Number of failed inference requests, all batch sizes"
                       f"\n# TYPE {FAILURE} counter\n")  # fmt: skip
            for model, version, stats, _ in rows:
                for reason in FAILURE_REASONS:
                    labels = _labels(model, version, reason)
                    out.append(f"{FAILURE}{{{labels}}} {stats.failures.get(reason, 0)}\n")
    out.append(f"# HELP {PENDING} Instantaneous number of pending requests awaiting execution "
               f"per-model.\n# TYPE {PENDING} gauge\n")  # fmt: skip
    for model, version, _, pending in rows:
        out.append(f"{PENDING}{{{_labels(model, version)}}} {pending}\n")
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
