"""The CLI's tables, against the pages."""

from datetime import UTC, datetime

from astraeus.cli import format as fmt

PAGE_RUNS = """NAME                          CLUSTER       STATE       REASON
urgent-eval                   main          Running     1 of 1 workers running
finetune-r50                  main          Pending     Preempted by higher-priority work (urgent-eval); waiting to run again
"""


def run(name, state, reason, cluster="main", workers=(), **status):
    return {"metadata": {"name": name, "cluster": cluster, "workspace": "vision"},
            "spec": {"cluster": cluster, "task_template": {"requested_resources": {"machines": 1}}},
            "status": {"state": state, "reason": reason, "workers": list(workers), **status}}


def test_runs_table_is_the_page_verbatim():
    runs = [run("urgent-eval", "Running", "1 of 1 workers running"),
            run("finetune-r50", "Pending",
                "Preempted by higher-priority work (urgent-eval); waiting to run again")]
    assert fmt.runs_table(runs) == PAGE_RUNS


def test_runs_table_long_names_keep_a_space():
    out = fmt.runs_table([run("x" * 35, "Completed", "", cluster="a-very-long-cluster")])
    assert out.splitlines()[1] == "x" * 35 + " a-very-long-cluster Completed"


def test_squeue_layout():
    now = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
    runs = [
        run("finetune", "Running", "1 of 1 workers running",
            workers=[{"machine": "gpu-01", "started_at": "2026-11-29T09:58:55Z"}], started_at="2026-11-29T09:58:55Z"),
        run("urgent-eval", "Pending", "Next to run (priority 0): waits for running work to end"),
        run("old", "Completed", "", workers=[{"machine": "gpu-02"}], started_at="2026-11-27T08:00:00Z",
            finished_at="2026-11-29T09:30:00Z"),
        run("bye", "Cancelled", "Deleted", workers=[{"machine": "gpu-01"}]),
    ]
    assert fmt.squeue_table(runs, now).splitlines() == [
        "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)",
        "          finetune      main finetune   vision  R       1:05      1 gpu-01",
        "       urgent-eval      main urgent-e   vision PD       0:00      1 (Next to run (priority 0): waits for "
        "running work to end)",
        "               old      main      old   vision CD 2-01:30:00      1 gpu-02",
        "               bye      main      bye   vision CA       0:00      1 gpu-01",
    ]


def test_slurm_states():
    assert fmt.SLURM_STATE == {"Pending": "PD", "Starting": "R", "Running": "R", "Stopping": "CG",
                               "Completed": "CD", "Failed": "F", "Cancelled": "CA"}


def test_slurm_elapsed():
    assert [fmt.slurm_elapsed(s) for s in (0, 65, 3600, 3725, 86400 + 61)] == [
        "0:00", "1:05", "1:00:00", "1:02:05", "1-00:01:01"]


def test_compress_ints():
    assert fmt.compress_ints([3]) == "3"
    assert fmt.compress_ints([0, 1, 2, 3, 4, 5, 6, 7]) == "0-7"
    assert fmt.compress_ints([5, 0, 1, 3]) == "0-1,3,5"


def test_human():
    assert fmt.human_bytes(137438953472) == "128 GiB"
    assert fmt.human_bytes(1536 * 1024**2) == "1.5 GiB"
    assert fmt.human_duration(1200) == "20m"
    assert fmt.human_duration(172800) == "2d"
    assert fmt.human_duration(5430) == "1h30m30s"


def test_machines_table_shows_gpus_used_and_free():
    out = fmt.machines_table([{"name": "gpu-01", "cluster": "main", "state": "Ready", "gpus": 8, "gpus_used": 1,
                               "gpus_free": 7, "cpu_cores": 64.0, "memory_bytes": 512 * 1024**3},
                              {"name": "gpu-02", "cluster": "main", "state": "Ready", "gpus": 8, "gpus_used": 0,
                               "gpus_free": 8, "cpu_cores": 64.0, "memory_bytes": 512 * 1024**3, "runtime": "process",
                               "address": "10.77.0.3", "shared_filesystems": {"lab": "/mnt/lab", "home": "/home"}}])
    assert out.splitlines() == [
        "NAME    CLUSTER  STATE  GPUS  GPUS USED  GPUS FREE  CPUS  MEMORY   RUNTIME  ADDRESS    SHARED FS",
        "gpu-01  main     Ready  8     1          7          64    512 GiB",
        "gpu-02  main     Ready  8     0          8          64    512 GiB  process  10.77.0.3  home,lab",
    ]


def test_describe_shows_spec_workers_history_and_why_not():
    r = {
        "metadata": {"name": "waiter", "workspace": "vision", "namespace": "ws-3f9c2a1b7d4e", "cluster": "main",
                     "created_at": "2026-11-29T09:00:00Z"},
        "spec": {"priority": -100, "start": "Gang", "task_template": {
            "image": "pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime", "command": "python",
            "args": ["-c", "print('hi there')"], "restart_policy": "OnFailure", "time_limit_seconds": 1200,
            "env": {"A": "1"}, "datavolume_refs": [{"name": "ft-ckpt", "mount_path": "/ckpt", "mode": "ReadWrite"}],
            "requested_resources": {"cpu_cores": 32, "memory_bytes": 137438953472, "gpu_requests": {"count": 8},
                                    "machines": 1}}},
        "status": {"state": "Pending", "reason": "Next to run (priority -100): waits for running work to end",
                   "preemptions": 1, "console_url": "http://x/o/acme/w/vision/jobs/main/waiter",
                   "workers": [{"name": "waiter-0", "state": "Pending", "restarts": 0, "preemptions": 1,
                                "machine": None, "gpu_indices": [], "environment": "/opt/envs/torch",
                                "reason": "Waiting to be placed",
                                "why_not": [{"machine": "gpu-01", "reason": "not enough free GPUs: 0 free, 8 asked"},
                                            {"machine": "gpu-02", "reason": "lost"}]}],
                   "history": [{"time": "2026-11-29T09:00:00Z", "state": "Pending", "reason": "Submitted"}]},
    }
    out = fmt.describe_run(r)
    assert "Name:           waiter\n" in out
    assert "Workspace:      vision (ws-3f9c2a1b7d4e)\n" in out
    assert "Image:          pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime\n" in out
    assert "Environment:    /opt/envs/torch" in out
    assert "Command:        python -c 'print('\"'\"'hi there'\"'\"')'\n" in out
    assert "Resources:      8 GPUs, 32 CPU cores, 128 GiB memory, 1 machine\n" in out
    assert "Time limit:     20m\n" in out
    assert "Drives:         ft-ckpt at /ckpt (ReadWrite)\n" in out
    assert "Priority:       -100\n" in out
    assert "waiter-0  Pending  0         1            -        -     Waiting to be placed" in out
    assert "History:\n  TIME                     STATE    REASON\n  2026-11-29 09:00:00 UTC  Pending  Submitted\n" in out
    assert out.endswith("Why it is not running yet (waiter-0):\n  gpu-01: not enough free GPUs: 0 free, 8 asked\n"
                        "  gpu-02: lost\n")


def test_runs_wide_table():
    from datetime import UTC, datetime

    from astraeus.cli.format import runs_wide_table

    now = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
    runs = [{"metadata": {"name": "train", "cluster": "main", "workspace": "vision",
                          "created_at": "2026-12-01T10:30:00Z"},
             "spec": {"priority": 50, "task_template": {"requested_resources": {"gpu_requests": {"count": 8}}}},
             "status": {"state": "Running", "reason": "1 of 1 workers running"}},
            {"metadata": {"name": "cpu-only", "cluster": "main", "workspace": "vision"},
             "spec": {"task_template": {}}, "status": {"state": "Pending"}}]
    assert runs_wide_table(runs, now) == (
        "NAME      CLUSTER  STATE    PRIORITY  GPUS  USER    AGE    REASON\n"
        "train     main     Running  50        8     vision  1h30m  1 of 1 workers running\n"
        "cpu-only  main     Pending            0     vision\n")


def test_to_yaml_keeps_the_apis_order():
    import yaml

    from astraeus.cli.format import to_yaml

    data = {"items": [{"metadata": {"name": "b: c"}, "spec": {"z": 1, "a": [1, 2]}}]}
    text = to_yaml(data)
    assert yaml.safe_load(text) == data
    keys = [ln.strip().split(":")[0] for ln in text.splitlines()]
    assert keys.index("z") < keys.index("a")
