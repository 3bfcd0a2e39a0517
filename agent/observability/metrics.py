"""Prometheus metrics of the agent, defined in one place.

Names follow edgeplex_<subsystem>_<name>_<unit>. Code updates them where the
thing happens (batcher, runners); http_api serves METRICS.registry at /metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from edgeplex.agent.observability.loop_metrics import (
    CounterChild,
    HistogramChild,
    LoopCounter,
    LoopHistogram,
)

_LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = LoopCounter(
            "edgeplex_agent_requests_total",
            "Inference requests received, per model.",
            ["model"],
            r,
        )
        self.failures = Counter(
            "edgeplex_agent_request_failures_total",
            "Inference requests that ended in an error, per model and gRPC status code.",
            ["model", "code"],
            registry=r,
        )
        self.request_duration = LoopHistogram(
            "edgeplex_agent_request_duration_seconds",
            "Time from a request's headers arriving to its result or error.",
            ["model"],
            _LATENCY_BUCKETS,
            r,
        )
        self.queue_duration = LoopHistogram(
            "edgeplex_agent_queue_duration_seconds",
            "Time a request waited in its model's queue before its batch was dispatched.",
            ["model"],
            _LATENCY_BUCKETS,
            r,
        )
        self.compute_duration = LoopHistogram(
            "edgeplex_agent_compute_duration_seconds",
            "ONNX Runtime execution time of one batch, measured in the runner.",
            ["model"],
            _LATENCY_BUCKETS,
            r,
        )
        self.batch_size = LoopHistogram(
            "edgeplex_agent_batch_size_requests",
            "Requests per executed batch.",
            ["model"],
            _BATCH_BUCKETS,
            r,
        )
        self.queue_depth = Gauge(
            "edgeplex_agent_queue_depth_requests",
            "Requests waiting in a model's queue.",
            ["model"],
            registry=r,
        )
        self.sequences = Gauge(
            "edgeplex_agent_sequences",
            "A stateful model's sequences: live (each holding a sequence slot) and waiting "
            "(STARTs in its backlog, waiting for a slot).",
            ["model", "state"],
            registry=r,
        )
        self.model_ready = Gauge(
            "edgeplex_agent_model_ready",
            "1 while the model is on the device, serving, else 0.",
            ["model"],
            registry=r,
        )
        self.model_memory = Gauge(
            "edgeplex_agent_model_memory_bytes",
            "Memory measured around the model's session creation.",
            ["model"],
            registry=r,
        )
        self.cpu_fallback = Gauge(
            "edgeplex_model_cpu_fallback",
            "1 while the model runs on the CPU although the runners ask for CUDA "
            "(runner.cpu_fallback).",
            ["model"],
            registry=r,
        )
        self.variant_bytes = Gauge(
            "edgeplex_agent_model_variant_bytes",
            "Memory of the model's session by the form it holds (original, int8, fp16); 0 "
            "for the forms it does not hold now.",
            ["model", "variant"],
            registry=r,
        )
        self.variant_requests = Counter(
            "edgeplex_agent_variant_requests_total",
            "Requests a variant served (the rest were served as shipped).",
            ["model", "variant"],
            registry=r,
        )
        self.variant_build_duration = Histogram(
            "edgeplex_agent_variant_build_duration_seconds",
            "Time to build (or find) and check a model's variants, in a runner.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.load_duration = Histogram(
            "edgeplex_agent_model_load_duration_seconds",
            "Session creation time in the runner.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tier_bytes = Gauge(
            "edgeplex_agent_tier_bytes",
            "Bytes held per residency tier (loaded, staged).",
            ["tier"],
            registry=r,
        )
        self.hot_models = Gauge(
            "edgeplex_agent_hot_models",
            "Models this site's own demand keeps resident: promotions take room from "
            "them last (hot_share).",
            registry=r,
        )
        self.promotions = Counter(
            "edgeplex_agent_promotions_total",
            "Models promoted to loaded, by the tier they came from (staged, cached).",
            ["source"],
            registry=r,
        )
        self.cold_starts = Counter(
            "edgeplex_agent_cold_starts_total",
            "Promotions a request started and waited for: it asked for a model not loaded "
            "here (placement's and admins' loads are not counted).",
            ["model"],
            registry=r,
        )
        self.demotions = Counter(
            "edgeplex_agent_demotions_total",
            "Models demoted, by reason (evicted, idle, requested, unload, replaced, oversize, "
            "staged_dropped).",
            ["reason"],
            registry=r,
        )
        self.promotion_duration = Histogram(
            "edgeplex_agent_promotion_duration_seconds",
            "Time to promote a model to loaded, by source tier.",
            ["source"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.promotion_stage_duration = Histogram(
            "edgeplex_agent_promotion_stage_duration_seconds",
            "Promotion time by stage: read, optimize, create, warmup.",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.instances = Gauge(
            "edgeplex_agent_model_instances",
            "Instances (worker threads) serving a model.",
            ["model"],
            registry=r,
        )
        self.rate_limited = Counter(
            "edgeplex_agent_rate_limiter_waits_total",
            "Times a model's next batch waited for its rate limiter resources "
            "(rate_limit: execution_count).",
            ["model"],
            registry=r,
        )
        self.hung_batches = Counter(
            "edgeplex_agent_hung_batches_total",
            "Batches that ran past the model's execution timeout (their runner was killed).",
            ["model"],
            registry=r,
        )
        self.refused = Counter(
            "edgeplex_agent_refused_total",
            "Requests refused before admission: too many promotions waiting, or the agent's "
            "cap on requests or bytes in flight reached (model '' when not in the repository).",
            ["model"],
            registry=r,
        )
        self.tenant_requests = Counter(
            "edgeplex_tenant_requests_total",
            "Inference requests by tenant (those this agent knows, plus anonymous and admin) "
            "and outcome: admitted, forbidden (a model outside its list), rate_limited, "
            "concurrency_limited.",
            ["tenant", "outcome"],
            registry=r,
        )
        self.shed = Counter(
            "edgeplex_agent_shed_requests_total",
            "Inference requests refused at a door before their body was read, by reason: "
            "loop_lag or memory (overload shedding), inflight_requests or inflight_bytes "
            "(the gate's caps), connection_bytes (one HTTP/2 connection's cap).",
            ["reason"],
            registry=r,
        )
        self.door_refusals = Counter(
            "edgeplex_door_refused_connections_total",
            "Connections a door refused or closed to protect itself, by door (http, grpc) and "
            "reason: connection caps, penalised addresses, deadlines, floods, protocol errors.",
            ["door", "reason"],
            registry=r,
        )
        self.door_connections = Gauge(
            "edgeplex_door_connections",
            "Open connections per door.",
            ["door"],
            registry=r,
        )
        self.loop_lag = Gauge(
            "edgeplex_agent_event_loop_lag_seconds",
            "How late the agent's event loop ran its last timer (overload shedding's input).",
            registry=r,
        )
        self.rejected_messages = Counter(
            "edgeplex_agent_rejected_messages_total",
            "Control messages (desired state, routes, key rollovers) dropped unused, by "
            "reason: malformed, unknown_key, bad_signature, wrong_kind, wrong_audience, "
            "expired, stale.",
            ["reason"],
            registry=r,
        )
        self.on_demand = Counter(
            "edgeplex_agent_on_demand_lookups_total",
            "Requests for a model held nowhere that asked the control plane for its "
            "catalog entry, by result: installed, not_in_catalog, failed.",
            ["result"],
            registry=r,
        )
        self.promotion_wait = Histogram(
            "edgeplex_agent_promotion_wait_seconds",
            "Time admitted requests waited for their model to be promoted.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.runner_restarts = Counter(
            "edgeplex_runner_restarts_total",
            "Runner processes restarted after they died.",
            ["runner"],
            registry=r,
        )
        self.runner_oom_kills = Counter(
            "edgeplex_runner_oom_kills_total",
            "Runners the kernel killed for exceeding their memory limit.",
            ["runner"],
            registry=r,
        )
        self.usage_refused = Counter(
            "edgeplex_agent_usage_refused_minutes",
            "Usage minutes the control plane refused for what they are, kept aside in "
            "usage_dir as <minute>.counts.refused (docs/tenants.md).",
            registry=r,
        )
        self.sandbox_layer = Gauge(
            "edgeplex_runner_sandbox_layer",
            "1 for each runner sandbox layer this host gives runners, 0 for each it cannot "
            "(why: GET /edgeplex/v1/memory, `sandbox`).",
            ["layer"],
            registry=r,
        )
        tensor_bytes = Counter(
            "edgeplex_runner_tensor_bytes_total",
            "Tensor bytes between the agent and its runners, by direction (request, result) "
            "and path: `shared` through the shared rings, `socket` inline in the frames.",
            ["direction", "path"],
            registry=r,
        )
        # (direction, through shared memory?) -> child, looked up once
        self.tensor_bytes = {
            (d, shared): tensor_bytes.labels(direction=d, path="shared" if shared else "socket")
            for d in ("request", "result")
            for shared in (True, False)
        }

        self._series: dict[str, ModelSeries] = {}

    def of_model(self, model: str) -> ModelSeries:
        """The per-request series of a model in the repository, looked up once: a
        `labels()` call takes a lock and hashes the labels on every request."""
        series = self._series.get(model)
        if series is None:
            series = self._series[model] = ModelSeries(
                self.requests.labels(model=model),
                self.request_duration.labels(model=model),
                self.batch_size.labels(model=model),
                self.compute_duration.labels(model=model),
                self.queue_duration.labels(model=model),
            )
        return series


@dataclass(frozen=True, slots=True)
class ModelSeries:
    requests: CounterChild
    request_duration: HistogramChild
    batch_size: HistogramChild
    compute_duration: HistogramChild
    queue_duration: HistogramChild


METRICS = AgentMetrics()
