"""trackpoint.metrics: recording, snapshots, thread-safety, Prometheus and OpenTelemetry export."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from trackpoint import metrics
from trackpoint.errors import InvalidArgumentError
from trackpoint.metrics import Figure, Registry
from trackpoint.metrics import registry as metrics_registry


@pytest.fixture
def registry() -> Registry:
    return Registry()


@pytest.fixture
def default_registry() -> Iterator[Registry]:
    metrics.reset()
    yield metrics.REGISTRY
    metrics.reset()


def test_default_figures_are_declared_with_stable_names(registry: Registry) -> None:
    assert {f.name: (f.kind, f.labels) for f in registry.figures()} == {
        "trackpoint_write_duration_seconds": ("histogram", ("mode", "phase")),
        "trackpoint_read_duration_seconds": ("histogram", ()),
        "trackpoint_training_time_between_writes_seconds": ("histogram", ()),
        "trackpoint_checkpoint_size_bytes": ("histogram", ()),
        "trackpoint_sharding_policy_duration_seconds": ("histogram", ("policy",)),
        "trackpoint_shards_written_total": ("counter", ()),
        "trackpoint_bytes_written_total": ("counter", ()),
        "trackpoint_bytes_read_total": ("counter", ()),
        "trackpoint_checksum_failures_total": ("counter", ()),
    }
    assert all(value == {} for value in registry.snapshot().values())


def test_counters_per_label_set(registry: Registry) -> None:
    registry.increment(metrics.BYTES_WRITTEN, 100)
    registry.increment(metrics.BYTES_WRITTEN, 23)
    registry.increment(metrics.SHARDS_WRITTEN)
    snap = registry.snapshot()
    assert snap[metrics.BYTES_WRITTEN] == {(): 123}
    assert snap[metrics.SHARDS_WRITTEN] == {(): 1}
    assert snap[metrics.CHECKSUM_FAILURES] == {}


def test_histogram_statistics_and_buckets(registry: Registry) -> None:
    for seconds in (0.002, 0.5, 0.5, 7200.0):
        registry.record_duration(metrics.WRITE_DURATION, seconds, mode="sync", phase="blocking")
    registry.record_duration(metrics.WRITE_DURATION, 3.0, mode="async", phase="background")
    series = registry.snapshot()[metrics.WRITE_DURATION]
    sync = series[(("mode", "sync"), ("phase", "blocking"))]
    assert sync["count"] == 4
    assert sync["sum"] == pytest.approx(7201.002)
    assert sync["min"] == 0.002
    assert sync["max"] == 7200.0
    buckets = sync["buckets"]
    assert list(buckets) == [*metrics.SECONDS_BUCKETS, math.inf]
    assert buckets[0.001] == 0
    assert buckets[0.005] == 1
    assert buckets[0.5] == 3  # upper bounds are inclusive
    assert buckets[3600.0] == 3
    assert buckets[math.inf] == 4
    assert series[(("mode", "async"), ("phase", "background"))]["count"] == 1


def test_sizes_use_byte_buckets(registry: Registry) -> None:
    registry.record_duration(metrics.CHECKPOINT_SIZE, 5 << 20)
    buckets = registry.snapshot()[metrics.CHECKPOINT_SIZE][()]["buckets"]
    assert list(buckets)[:-1] == list(metrics.BYTES_BUCKETS)
    assert buckets[float(4 << 20)] == 0
    assert buckets[float(16 << 20)] == 1


def test_timed_records_completed_blocks_only(registry: Registry) -> None:
    with registry.timed(metrics.SHARDING_POLICY_DURATION, policy="MaxShardSizePolicy(1024)"):
        pass
    with pytest.raises(RuntimeError), registry.timed(metrics.READ_DURATION):
        raise RuntimeError("read failed")
    snap = registry.snapshot()
    timed = snap[metrics.SHARDING_POLICY_DURATION][(("policy", "MaxShardSizePolicy(1024)"),)]
    assert timed["count"] == 1
    assert timed["min"] >= 0
    assert snap[metrics.READ_DURATION] == {}


def _stats(mode: str = "sync", **overrides: object) -> metrics.WriteStats:
    fields: dict[str, object] = {
        "prefix": "/ckpt/ckpt-1", "mode": mode, "blocking_seconds": 0.2,
        "background_seconds": 1.5 if mode == "async" else 0.0, "training_seconds": None,
        "checkpoint_bytes": 3000, "shard_bytes": (1000, 1500),
        "sharding_policy": "ShardByTaskPolicy", "sharding_seconds": 0.001,
    }  # fmt: skip
    fields.update(overrides)
    return metrics.WriteStats(**fields)  # type: ignore[arg-type]


def test_record_write_records_every_figure_once(registry: Registry) -> None:
    registry.record_write(_stats("sync"))
    registry.record_write(_stats("async", training_seconds=4.0, shard_bytes=(2000,)))
    snap = registry.snapshot()
    durations = snap[metrics.WRITE_DURATION]
    assert set(durations) == {
        (("mode", "sync"), ("phase", "blocking")),
        (("mode", "async"), ("phase", "blocking")),
        (("mode", "async"), ("phase", "background")),
    }
    assert durations[(("mode", "async"), ("phase", "background"))]["sum"] == 1.5
    assert snap[metrics.CHECKPOINT_SIZE][()]["count"] == 2
    assert snap[metrics.SHARDS_WRITTEN] == {(): 3}
    assert snap[metrics.BYTES_WRITTEN] == {(): 6000}
    assert snap[metrics.TRAINING_TIME_BETWEEN_WRITES][()]["sum"] == 4.0  # first write: none
    policy = snap[metrics.SHARDING_POLICY_DURATION][(("policy", "ShardByTaskPolicy"),)]
    assert policy["count"] == 2


def test_record_write_rejects_bad_stats_and_records_nothing(registry: Registry) -> None:
    with pytest.raises(InvalidArgumentError, match="'sync' or 'async'"):
        registry.record_write(_stats("eager"))
    with pytest.raises(InvalidArgumentError, match="must be >= 0"):
        registry.record_write(_stats(blocking_seconds=-1.0))
    assert all(value == {} for value in registry.snapshot().values())


def test_training_clock_restarts_when_the_caller_stops_waiting(registry: Registry) -> None:
    first = registry.begin_write()
    assert first.training_seconds is None  # nothing before the first write
    registry.record_write(_stats("sync"))  # a sync write ends at its commit
    second = registry.begin_write()
    assert second.training_seconds is not None and second.training_seconds >= 0
    handed_off = registry.end_blocking(second)  # async: training resumes at the hand-off
    assert handed_off.started == second.started
    assert handed_off.blocking_seconds is not None and handed_off.blocking_seconds >= 0
    third = registry.begin_write()
    # The async write has not committed, yet the clock counts from its hand-off.
    assert third.training_seconds is not None
    assert third.training_seconds <= third.started - second.started
    registry.reset()
    assert registry.begin_write().training_seconds is None


def test_reset_forgets_values(registry: Registry) -> None:
    registry.increment(metrics.BYTES_READ, 5)
    registry.record_write(_stats())
    registry.reset()
    assert all(value == {} for value in registry.snapshot().values())
    assert registry.begin_write().training_seconds is None


def test_listeners_get_each_recording_and_never_break_it(
    registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    registry.increment(metrics.BYTES_READ, 7)
    seen: list[tuple[str, float, object]] = []

    def listener(figure: Figure, value: float, key: object) -> None:
        seen.append((figure.name, value, key))

    def broken(figure: Figure, value: float, key: object) -> None:
        raise RuntimeError("exporter down")

    registry.add_listener(listener, replay_counters=True)
    registry.add_listener(broken)
    registry.record_duration(metrics.READ_DURATION, 0.5)
    registry.increment(metrics.BYTES_READ, 3)
    assert seen == [
        (metrics.BYTES_READ, 7, ()),  # replayed total
        (metrics.READ_DURATION, 0.5, ()),
        (metrics.BYTES_READ, 3, ()),
    ]
    assert "exporter down" in caplog.text
    registry.remove_listener(listener)
    registry.increment(metrics.BYTES_READ, 1)
    assert len(seen) == 3
    assert registry.snapshot()[metrics.BYTES_READ] == {(): 11}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r: r.increment("trackpoint_typo_total"), "unknown figure 'trackpoint_typo_total'"),
        (lambda r: r.increment(metrics.WRITE_DURATION), "is a histogram, not a counter"),
        (lambda r: r.record_duration(metrics.WRITE_DURATION, 1.0, mode="sync"), "takes labels"),
        (lambda r: r.record_duration(metrics.READ_DURATION, 1.0, mode="sync"), "takes labels"),
        (lambda r: r.record_duration(metrics.READ_DURATION, -1.0), "must be >= 0"),
        (lambda r: r.record_duration(metrics.READ_DURATION, math.nan), "must be >= 0"),
        (lambda r: r.increment(metrics.BYTES_READ, -5), "only goes up"),
    ],
)
def test_bad_recordings_are_rejected(registry: Registry, call: object, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        call(registry)  # type: ignore[operator]


def test_declare_gauge(registry: Registry) -> None:
    gauge = Figure("trackpoint_test_in_flight", "gauge", "Writes in flight", labels=("task",))
    registry.declare(gauge)
    registry.declare(gauge)  # identical: no-op
    registry.set_gauge("trackpoint_test_in_flight", 3, task=0)
    registry.set_gauge("trackpoint_test_in_flight", 1, task=0)
    assert registry.snapshot()["trackpoint_test_in_flight"] == {(("task", "0"),): 1}
    with pytest.raises(InvalidArgumentError, match="already declared"):
        registry.declare(Figure("trackpoint_test_in_flight", "counter", "other"))


def test_module_functions_use_default_registry(default_registry: Registry) -> None:
    # The layers' recording functions live in trackpoint.metrics.registry, not the public API.
    metrics_registry.increment(metrics.CHECKSUM_FAILURES)
    metrics_registry.record_duration(metrics.READ_DURATION, 0.25)
    with metrics_registry.timed(metrics.READ_DURATION):
        pass
    snap = metrics.snapshot()
    assert snap == default_registry.snapshot()
    assert snap[metrics.CHECKSUM_FAILURES] == {(): 1}
    assert snap[metrics.READ_DURATION][()]["count"] == 2
    metrics.reset()
    assert metrics.snapshot()[metrics.CHECKSUM_FAILURES] == {}


def test_snapshot_is_a_copy(registry: Registry) -> None:
    registry.record_duration(metrics.READ_DURATION, 1.0)
    snap = registry.snapshot()
    registry.record_duration(metrics.READ_DURATION, 1.0)
    assert snap[metrics.READ_DURATION][()]["count"] == 1


def test_thread_safety(registry: Registry) -> None:
    threads_n, per_thread = 8, 2000
    barrier = threading.Barrier(threads_n)

    def work(i: int) -> None:
        barrier.wait()
        for _ in range(per_thread):
            registry.increment(metrics.BYTES_WRITTEN, 3)
            registry.record_duration(
                metrics.WRITE_DURATION, 0.01, mode="async", phase=("blocking", "background")[i % 2]
            )
            if i == 0:
                registry.snapshot()  # readers run concurrently with writers

    threads = [threading.Thread(target=work, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = registry.snapshot()
    assert snap[metrics.BYTES_WRITTEN] == {(): 3 * threads_n * per_thread}
    durations = snap[metrics.WRITE_DURATION]
    assert sum(h["count"] for h in durations.values()) == threads_n * per_thread
    for histogram in durations.values():
        assert histogram["buckets"][math.inf] == histogram["count"] == threads_n * per_thread // 2
        assert histogram["sum"] == pytest.approx(0.01 * histogram["count"])


def test_prometheus_exposition(registry: Registry) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    target = prometheus_client.CollectorRegistry()
    collector = registry.register_prometheus(target)
    assert registry.register_prometheus(target) is collector  # idempotent
    registry.increment(metrics.BYTES_WRITTEN, 4096)
    registry.record_duration(metrics.WRITE_DURATION, 0.3, mode="sync", phase="blocking")
    registry.record_duration(metrics.SHARDING_POLICY_DURATION, 0.002, policy="ShardByTaskPolicy")

    text = prometheus_client.generate_latest(target).decode()
    assert "trackpoint_bytes_written_total 4096.0" in text
    assert (
        'trackpoint_write_duration_seconds_bucket{le="0.5",mode="sync",phase="blocking"} 1.0'
        in text
    )
    assert (
        'trackpoint_write_duration_seconds_bucket{le="0.25",mode="sync",phase="blocking"} 0.0'
        in text
    )
    assert 'trackpoint_write_duration_seconds_count{mode="sync",phase="blocking"} 1.0' in text
    assert 'trackpoint_write_duration_seconds_sum{mode="sync",phase="blocking"} 0.3' in text
    assert (
        'trackpoint_sharding_policy_duration_seconds_count{policy="ShardByTaskPolicy"} 1.0' in text
    )
    # Values are read at scrape time.
    registry.increment(metrics.BYTES_WRITTEN, 4)
    assert target.get_sample_value("trackpoint_bytes_written_total") == 4100
    target.unregister(collector)
    assert "trackpoint_" not in prometheus_client.generate_latest(target).decode()
    assert registry.register_prometheus(target) is collector  # registered again
    assert target.get_sample_value("trackpoint_bytes_written_total") == 4100


def _otel_points(reader: object) -> dict[str, list[object]]:
    data = reader.get_metrics_data()  # type: ignore[attr-defined]
    points: dict[str, list[object]] = {}
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            assert scope_metrics.scope.name == "trackpoint"
            for metric in scope_metrics.metrics:
                points[metric.name] = list(metric.data.data_points)
    return points


def test_opentelemetry_one_instrument_per_figure(registry: Registry) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader

    registry.increment(metrics.BYTES_READ, 10)  # before registration: the total carries over
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    exporter = registry.register_opentelemetry(provider)
    assert registry.register_opentelemetry(provider) is exporter  # idempotent
    registry.increment(metrics.BYTES_READ, 5)
    registry.record_duration(metrics.WRITE_DURATION, 2.0, mode="async", phase="background")
    registry.record_duration(metrics.WRITE_DURATION, 4.0, mode="async", phase="background")
    gauge = Figure("trackpoint_test_pending", "gauge", "Saves pending")
    registry.declare(gauge)  # declared after registration: exported too
    registry.set_gauge(gauge.name, 1)

    points = _otel_points(reader)
    assert [(dict(p.attributes), p.value) for p in points[metrics.BYTES_READ]] == [({}, 15)]
    assert [p.value for p in points[gauge.name]] == [1]
    (histogram,) = points[metrics.WRITE_DURATION]
    assert isinstance(histogram, HistogramDataPoint)
    assert dict(histogram.attributes) == {"mode": "async", "phase": "background"}
    assert (histogram.count, histogram.sum, histogram.min, histogram.max) == (2, 6.0, 2.0, 4.0)
    assert tuple(histogram.explicit_bounds) == metrics.SECONDS_BUCKETS  # our buckets
    per_bucket = dict(zip([*histogram.explicit_bounds, math.inf], histogram.bucket_counts))
    assert per_bucket[2.5] == 1 and per_bucket[5.0] == 1  # non-cumulative in OpenTelemetry
    assert sum(histogram.bucket_counts) == 2

    exporter.close()  # stops passing recordings on
    registry.increment(metrics.BYTES_READ, 100)
    assert [p.value for p in _otel_points(reader)[metrics.BYTES_READ]] == [15]
    assert registry.register_opentelemetry(provider) is exporter  # resumes, no replay
    registry.increment(metrics.BYTES_READ, 1)
    assert [p.value for p in _otel_points(reader)[metrics.BYTES_READ]] == [16]
    provider.shutdown()


def test_import_loads_no_exporter() -> None:
    code = (
        "import sys, trackpoint; "
        "print([m for m in ('prometheus_client', 'opentelemetry', 'trackpoint.metrics.export', "
        "'trackpoint.cli.progress') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
