"""`astra astraeus templates list|show|create|replace|delete`, `astra astraeus run --template NAME` and
`astra slurm sbatch --template=NAME` (also `#SBATCH --template=NAME`): the pure parts, then `astra` as a subprocess
against a real local cluster (one machine gpu-01 with 8 GPUs, the process runtime)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from astraeus.cli.astra import template_run_body
from astraeus.cli.slurm import SbatchError, build_job, parse_command_line
from tests.cli.test_commands import astra, ok, one_line_error

SCRIPT = "#!/bin/bash\n#SBATCH -J from-tpl\n#SBATCH --template=ft\necho \"$GREETING\"\n"


def _job(argv: list[str], script: str = SCRIPT) -> dict:
    return build_job(parse_command_line([*argv, "job.sbatch"]), script, "job.sbatch").spec


# --- pure --------------------------------------------------------------------------------------------------------


def test_sbatch_template_line_names_the_template_and_leaves_the_rest_to_it():
    spec = _job([])
    assert spec["metadata"] == {"name": "from-tpl"}
    assert spec["spec"]["template"] == "ft"
    tt = spec["spec"]["task_template"]
    # only what runs the script: the template gives the image, drives, env, resources and restart policy
    assert tt == {"command": "bash", "args": ["/astraeus/slurm/from-tpl.sbatch"],
                  "configs": [{"mounts": ["/astraeus/slurm/from-tpl.sbatch"], "value": SCRIPT}]}
    assert "start" not in spec["spec"] and "priority" not in spec["spec"]


def test_sbatch_options_still_win_over_the_template():
    spec = _job(["--template=eval", "--nice=100", "--gres=gpu:2", "--time=10", "--container-image=img:1"])
    assert spec["spec"]["template"] == "eval" and spec["spec"]["priority"] == -100
    tt = spec["spec"]["task_template"]
    assert tt["image"] == "img:1" and tt["time_limit_seconds"] == 600
    assert tt["requested_resources"] == {"gpu_requests": {"count": 2}}
    spec = _job(["-N", "2"])
    assert spec["spec"]["task_template"]["requested_resources"] == {"machines": 2}


def test_sbatch_without_an_image_or_a_template_says_both_ways():
    with pytest.raises(SbatchError) as e:
        _job([], "#!/bin/bash\necho\n")
    assert "--container-image=IMAGE" in str(e.value) and "--template=NAME" in str(e.value)


def test_a_bad_template_name_and_container_mounts_are_refused_by_name():
    with pytest.raises(SbatchError) as e:
        _job(["--template=Not A Name"])
    assert str(e.value).startswith("sbatch: error: invalid --template='Not A Name': give a template's name")
    with pytest.raises(SbatchError) as e:
        parse_command_line(["--container-mounts=/data:/ckpt", "x.sh"])
    assert str(e.value).startswith("sbatch: option --container-mounts is not supported by astra slurm")
    assert "--template=NAME" in str(e.value)


def test_run_template_body_has_only_the_options_given():
    kw = dict(name="t1", command=[], image=None, gpus=None, machines=None, cpus=None, mem=None, time=None, env=None,
              cluster=None, start=None)
    assert template_run_body("ft", **kw) == {"metadata": {"name": "t1"},
                                             "spec": {"template": "ft", "task_template": {}}}
    body = template_run_body("ft", **{**kw, "command": ["python"], "gpus": 2, "mem": "1G", "env": ["A=1"]})
    assert body["spec"]["task_template"] == {"command": "python", "args": [], "env": {"A": "1"},
                                             "requested_resources": {"memory_bytes": 2 << 30,
                                                                     "gpu_requests": {"count": 2}}}


# --- against a cluster ---------------------------------------------------------------------------------------------

DRIVE = {"metadata": {"name": "tpl-ckpt"},
         "spec": {"sources": [{"node": "gpu-01", "path": "/data/astraeus/tpl-ckpt", "mount_path": "/ckpt",
                               "mode": "ReadWrite"}], "permissions": {"create": True}}}
FT = {"metadata": {"name": "ft", "labels": {"team": "vision"}},
      "spec": {"priority": -10, "task_template": {
          "image": "python:3.11", "command": "python", "args": ["-c", "print('the template command')"],
          "env": {"GREETING": "hello from the template"}, "restart_policy": "Never",
          "datavolume_refs": [{"name": "tpl-ckpt", "mount_path": "/ckpt", "mode": "ReadWrite"}]}}}


@pytest.fixture
def c(shared_cluster, tmp_path):
    shutil.rmtree("/data/astraeus/tpl-ckpt", ignore_errors=True)
    (tmp_path / "drive.json").write_text(json.dumps(DRIVE))
    (tmp_path / "ft.json").write_text(json.dumps(FT))
    yield shared_cluster
    with shared_cluster.client() as h:
        for run in ("t1", "t2", "from-tpl"):
            h.delete(f"/runs/{run}")
        h.delete("/templates/ft")
        h.delete("/drives/tpl-ckpt")


def _logs(c, worker: str, text: str) -> str:
    return c.wait_for(lambda: (out := ok(astra(c, "astraeus", "logs", worker))) and text in out and out, 60,
                      interval=0.5, what=f"{text!r} in {worker}")


def test_templates_from_the_cli_and_runs_that_name_one(c, tmp_path):
    ok(astra(c, "astraeus", "drives", "create", "-f", "drive.json", cwd=tmp_path))
    assert ok(astra(c, "astraeus", "templates", "create", "-f", "ft.json", cwd=tmp_path)) == \
        "template ft created (version 1)\n"
    rows = ok(astra(c, "astraeus", "templates", "list")).splitlines()
    assert rows[0].split() == ["NAME", "VERSION", "PRIORITY", "IMAGE", "DRIVES", "UPDATED"]
    assert rows[1].split()[:5] == ["ft", "1", "-10", "python:3.11", "tpl-ckpt:/ckpt"]
    shown = json.loads(ok(astra(c, "astraeus", "templates", "show", "ft")))
    assert shown["spec"]["task_template"]["env"] == {"GREETING": "hello from the template"}
    err = one_line_error(astra(c, "astraeus", "templates", "create", "-f", "ft.json", cwd=tmp_path))
    assert err.startswith("error: 409") and "a template named ft already exists" in err

    # the template's command, drive and env; the run's name
    assert ok(astra(c, "astraeus", "run", "--template", "ft", "--name", "t1")).startswith("t1 submitted to main: ")
    _logs(c, "t1-0", "the template command")
    run = c.run("t1")
    assert run["spec"]["priority"] == -10 and run["metadata"]["labels"] == {"team": "vision"}
    assert run["spec"]["task_template"]["datavolume_refs"][0]["name"] == "tpl-ckpt"
    assert "Template:" in (out := ok(astra(c, "astraeus", "describe", "t1"))) and "ft (version 1)" in out

    # the run's own command, with the template's env and drive
    ok(astra(c, "astraeus", "run", "--template", "ft", "--name", "t2", "--env", "EXTRA=1", "--",
             "bash", "-c", 'echo "$GREETING $EXTRA" > /ckpt/t2.txt && cat /ckpt/t2.txt'))
    _logs(c, "t2-0", "hello from the template 1")
    assert Path("/data/astraeus/tpl-ckpt/t2.txt").read_text() == "hello from the template 1\n"

    # sbatch: #SBATCH --template=ft in the script
    (tmp_path / "job.sbatch").write_text(SCRIPT)
    assert ok(astra(c, "slurm", "sbatch", "job.sbatch", cwd=tmp_path)) == "Submitted batch job from-tpl\n"
    _logs(c, "from-tpl-0", "hello from the template")
    assert c.run("from-tpl")["spec"]["task_template"]["datavolume_refs"][0]["mount_path"] == "/ckpt"

    changed = json.loads(json.dumps(FT))
    changed["spec"]["priority"] = -20
    (tmp_path / "ft.json").write_text(json.dumps(changed))
    assert ok(astra(c, "astraeus", "templates", "replace", "-f", "ft.json", cwd=tmp_path)) == \
        "template ft replaced (version 2)\n"
    assert ok(astra(c, "astraeus", "templates", "delete", "ft")) == "template ft deleted\n"
    err = one_line_error(astra(c, "astraeus", "templates", "show", "ft"))
    assert err.startswith("error: 404") and "template ft not found" in err


def test_a_template_that_does_not_exist_is_one_line_and_nothing_is_submitted(c, tmp_path):
    err = one_line_error(astra(c, "astraeus", "run", "--template", "nope", "--name", "t1", "--", "true"))
    assert err.startswith("error: 404") and "template nope does not exist in workspace vision" in err
    (tmp_path / "job.sbatch").write_text(SCRIPT)
    err = one_line_error(astra(c, "slurm", "sbatch", "--template=nope", "job.sbatch", cwd=tmp_path))
    assert err.startswith("sbatch: error: Batch job submission failed: 404")
    with c.client() as h:
        assert h.get("/runs/t1").status_code == 404 and h.get("/runs/from-tpl").status_code == 404
