"""Counters and histograms of the request path, updated on the event loop only.

prometheus_client's own take a mutex on every update and check on every
observation that the series may be observed: several microseconds a request, on
the one thread that serves every request. These are plain numbers, since only the
loop writes them; the registry reads them when /metrics is scraped (on the same
loop), in Prometheus's text format, with the same names and labels.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class HistogramChild:
    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last is +Inf
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        # Buckets are upper bounds, inclusive: the first bound >= amount.
        self.counts[bisect_left(self._bounds, amount)] += 1
        self.sum += amount


Child = TypeVar("Child", CounterChild, HistogramChild)


class _Family(Collector, Generic[Child]):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry) -> None:  # fmt: skip
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], Child] = {}
        registry.register(self)

    def labels(self, **labels: str) -> Child:
        key = tuple(str(labels[name]) for name in self.labelnames)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._new()
        return child

    def _new(self) -> Child:
        raise NotImplementedError


class LoopCounter(_Family[CounterChild]):
    def _new(self) -> CounterChild:
        return CounterChild()

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in list(self._children.items()):
            family.add_metric(list(key), child.value)
        yield family

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)


class LoopHistogram(_Family[HistogramChild]):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 buckets: Sequence[float], registry: CollectorRegistry) -> None:  # fmt: skip
        self.bounds = tuple(float(b) for b in buckets)
        super().__init__(name, documentation, labelnames, registry)

    def _new(self) -> HistogramChild:
        return HistogramChild(self.bounds)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        edges = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        for key, child in list(self._children.items()):
            cumulative, buckets = 0, []
            for edge, count in zip(edges, child.counts, strict=True):
                cumulative += count
                buckets.append((edge, cumulative))
            family.add_metric(list(key), buckets, child.sum)
        yield family

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
