"""The Alibaba GPU trace reader on real files (the whole machine list and the first 500 tasks, kept in
tests/sim/data with their attribution), and a slice of the trace through the real scheduler."""

from __future__ import annotations

from collections import Counter

from astraeus.sim import load_trace, read_alibaba_tasks, read_machines, simulate_main
from astraeus.sim.trace import QOS_PRIORITY


def test_machines_file(trace_dir):
    machines = read_machines(trace_dir / "openb_node_list_gpu_node.csv")
    assert len(machines) == 1213
    assert sum(m.gpus for m in machines) == 6212
    first = machines[0]
    assert (first.name, first.gpus, first.cpu_cores, first.memory_bytes) == ("openb-node-0000", 2, 64.0, 262144 << 20)
    assert dict(first.labels) == {"model": "P100"}


def test_pod_file_counts(trace_dir):
    tasks, counts = read_alibaba_tasks(trace_dir / "openb_pod_list_default.csv")
    assert counts["read"] == 500
    assert counts["unknown_duration"] == 35  # no scheduled_time: pending when the trace was cut
    assert len(tasks) == 500 - 35
    assert Counter(t.priority_class for t in tasks) == Counter({"BE": 253, "LS": 199, "Burstable": 11, "Guaranteed": 2})
    assert all(t.priority == QOS_PRIORITY[t.priority_class] for t in tasks)
    assert counts["shared_gpu"] == sum(t.shared_gpu for t in tasks) > 0
    assert all(t.gpus >= 1 for t in tasks if t.shared_gpu)
    assert len({t.workspace for t in tasks}) == 4
    first = tasks[0]
    assert (first.name, first.submit_time, first.duration, first.gpus, first.recorded_wait) == (
        "openb-pod-0000", 0.0, 12537496.0, 1, 0.0
    )


def test_gpu_spec_restricts_machines(trace_dir):
    machines = read_machines(trace_dir / "openb_node_list_gpu_node.csv")
    tasks, counts = read_alibaba_tasks(trace_dir / "openb_pod_list_gpuspec33.csv", machines, limit=500)
    restricted = [t for t in tasks if t.machine_names is not None]
    assert counts["gpu_spec"] == len(restricted) > 0
    models = {m.name: dict(m.labels)["model"] for m in machines}
    t = restricted[0]
    assert t.machine_names and all(models[n] in {"P100", "T4", "V100M16", "V100M32", "G2", "G3", "A10"} for n in t.machine_names)


def test_limit_and_honest_time_limits(trace_dir):
    trace = load_trace(
        trace_dir / "openb_node_list_gpu_node.csv", trace_dir / "openb_pod_list_default.csv",
        limit=100, honest_time_limits=True,
    )
    assert trace.limited_to == 100
    assert len(trace.tasks) + trace.skipped_unknown_duration == 100
    assert all(t.time_limit is not None and t.time_limit >= t.duration and t.time_limit % 60 == 0 for t in trace.tasks)


def test_a_slice_of_the_trace_through_the_scheduler(trace_dir):
    r = simulate_main(
        trace_dir / "openb_node_list_gpu_node.csv", trace_dir / "openb_pod_list_default.csv",
        limit=300, max_machines=40, quiet=True,
    )
    assert r["invalid_placements"] == 0, r["invalid_examples"]
    assert r["trace"]["tasks"] + r["trace"]["skipped_unknown_duration"] == 300
    assert 0 < r["utilisation"] <= 1.0
    assert r["peak_gpus_busy"] <= r["trace"]["gpus"]
    assert set(r["waits"]) <= {"LS", "Guaranteed", "Burstable", "BE"}
    assert r["waits"]["LS"]["recorded"]["n"] > 0
    assert r["scheduler"]["plans"] > 0
