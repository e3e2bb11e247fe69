"""`astra astraeus run`'s spec and parsers."""

import pytest

from astraeus.cli.spec import SpecError, build_run_spec, parse_duration, parse_env, parse_memory

TORCH = "import torch,time;print(torch.cuda.device_count(),'GPUs');time.sleep(300)"

# The page's urgent.json, the reference for `astra astraeus run`.
URGENT = {
    "metadata": {"name": "urgent-eval"},
    "spec": {
        "start": "Independent",
        "task_template": {
            "image": "pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime",
            "command": "python",
            "args": ["-c", "import torch,time;print(torch.cuda.device_count(),'GPUs');time.sleep(300)"],
            "restart_policy": "Never",
            "time_limit_seconds": 1200,
            "requested_resources": {
                "cpu_cores": 32, "memory_bytes": 137438953472,
                "gpu_requests": {"count": 8}, "machines": 1,
                "node_selection": {"mode": "Any"},
            },
        },
    },
}


def test_the_page_command_is_urgent_json():
    spec = build_run_spec(name="urgent-eval", image="pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime", gpus=8,
                          machines=1, cpus=4, mem="16G", time="20m", command=["python", "-c", TORCH])
    assert spec == URGENT


def test_without_gpus_cpus_and_mem_are_totals():
    spec = build_run_spec(name="cpu", image="img", cpus=2.5, mem="3G", command=["true"], env=["A=1", "B=x=y"])
    tt = spec["spec"]["task_template"]
    assert tt["requested_resources"] == {"cpu_cores": 2.5, "memory_bytes": 3 * 1024**3,
                                         "node_selection": {"mode": "Any"}}
    assert tt["env"] == {"A": "1", "B": "x=y"}
    assert tt["args"] == []


@pytest.mark.parametrize("text,seconds", [("20m", 1200), ("2h", 7200), ("1h30m", 5400), ("1d12h", 129600),
                                          ("90s", 90), ("1.5h", 5400), ("48H", 172800)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["20", "20 minutes", "m", "", "1h-5m", "0m", "1:00:00"])
def test_bad_durations(text):
    with pytest.raises(SpecError, match="--time"):
        parse_duration(text)


@pytest.mark.parametrize("text,n", [("16G", 16 * 1024**3), ("500M", 500 * 1024**2), ("1T", 1024**4),
                                    ("512Mi", 512 * 1024**2), ("16GiB", 16 * 1024**3), ("16GB", 16 * 1024**3),
                                    ("0.5G", 512 * 1024**2)])
def test_memory(text, n):
    assert parse_memory(text) == n


@pytest.mark.parametrize("text", ["16", "lots", "16X", "", "0G"])
def test_bad_memory(text):
    with pytest.raises(SpecError, match="--mem"):
        parse_memory(text)


@pytest.mark.parametrize("items", [["NOEQUALS"], ["=v"], ["1A=v"]])
def test_bad_env(items):
    with pytest.raises(SpecError, match="--env"):
        parse_env(items)


@pytest.mark.parametrize("kw,needle", [
    ({"name": "", "image": "i", "command": ["x"]}, "--name"),
    ({"name": "a", "image": None, "command": ["x"]}, "--image"),
    ({"name": "a", "image": "i", "command": []}, "after --"),
    ({"name": "a", "image": "i", "command": ["x"], "gpus": -1}, "--gpus"),
    ({"name": "a", "image": "i", "command": ["x"], "machines": 0}, "--machines"),
    ({"name": "a", "image": "i", "command": ["x"], "start": "Sometimes"}, "--start"),
])
def test_missing_or_bad_options(kw, needle):
    with pytest.raises(SpecError, match=needle):
        build_run_spec(**kw)
