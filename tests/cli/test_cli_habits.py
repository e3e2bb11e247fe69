"""`astra`'s habits (issue 44): --version, shell completion, YAML specs, `runs -o wide|yaml`, every field of a
refused body, `logs` of a run not started yet, and the refusals of bad input. Real `astra` subprocesses; those
that need an API run against a local cluster (`astraeus up`: gpu-01 with 8 GPUs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from tests.cli.test_commands import IMAGE, astra, cleanup, ok, one_line_error

ASTRA = str(Path(sys.executable).parent / "astra")
SLEEP = ["python3", "-c", "import time; time.sleep(300)"]


def bare(*args: str, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """`astra` with no API configured."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("ASTRAEUS_")}
    e.update(ASTRAEUS_CONFIG="/nonexistent/astra-config.json", **(env or {}))
    return subprocess.run([ASTRA, *args], env=e, input=stdin, capture_output=True, text=True, timeout=60)


@pytest.fixture
def c(shared_cluster):
    return shared_cluster


# --- no API needed ---------------------------------------------------------------------------------------------


def test_version():
    r = bare("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"astra {version('astraeus')}\n"


def test_completion_scripts_and_completing():
    for shell, mark in (("bash", "complete -o default -F _astra_completion astra"), ("zsh", "#compdef astra"),
                        ("fish", "complete --command astra")):
        r = bare("completion", shell)
        assert r.returncode == 0, r.stderr
        assert mark in r.stdout and "_ASTRA_COMPLETE" in r.stdout
    # what the bash script runs at each <TAB>
    r = bare(env={"_ASTRA_COMPLETE": "complete_bash", "COMP_WORDS": "astra astraeus ru", "COMP_CWORD": "2"})
    assert r.stdout.split() == ["run", "runs"]
    assert "--install-completion" in bare("--help").stdout


def test_completion_for_an_unknown_shell_is_refused():
    r = bare("completion", "tcsh")
    assert one_line_error(r) == "error: completion tcsh: give one of bash, zsh, fish"


def test_a_yaml_spec_is_read_like_json(tmp_path):
    spec = {"metadata": {"name": "from-yaml"}, "spec": {"task_template": {
        "image": IMAGE, "command": "python", "args": ["-c", "print('hi: there')"],
        "requested_resources": {"gpu_requests": {"count": 2}}}}}
    for name in ("run.yaml", "run.yml"):
        (tmp_path / name).write_text(yaml.safe_dump(spec, sort_keys=False))
        r = bare("astraeus", "run", "-f", str(tmp_path / name), "--dry-run")
        assert json.loads(ok(r)) == spec
    r = bare("astraeus", "run", "-f", "-", "--dry-run", stdin=yaml.safe_dump(spec))  # stdin: JSON, else YAML
    assert json.loads(ok(r)) == spec


def test_a_broken_yaml_spec_says_where(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text("metadata:\n  name: x\nspec: [unclosed\n")
    err = one_line_error(bare("astraeus", "run", "-f", str(p), "--dry-run"))
    assert err.startswith(f"error: {p} is not valid YAML at line ") and "(set ASTRA_DEBUG" not in err


def test_a_json_file_that_is_yaml_says_to_rename_it(tmp_path):
    p = tmp_path / "run.json"
    p.write_text("metadata:\n  name: x\n")
    err = one_line_error(bare("astraeus", "run", "-f", str(p), "--dry-run"))
    assert err.startswith(f"error: {p} is not valid JSON: ") and err.endswith("(a YAML spec: name it .yaml or .yml)")


def test_a_bogus_state_is_refused_with_the_valid_ones():
    err = one_line_error(bare("astraeus", "runs", "--state", "Bogus"))
    assert err == "error: --state Bogus: use one of Pending, Starting, Running, Stopping, Completed, Failed, Cancelled"


def test_an_unknown_output_is_refused():
    err = one_line_error(bare("astraeus", "runs", "-o", "xml"))
    assert err == "error: -o xml: use -o wide, -o json or -o yaml (or leave it out for the table)"
    err = one_line_error(bare("astraeus", "runs", "-o", "yaml", "--watch"))
    assert err == "error: --watch shows the table; leave out -o yaml"


# --- against a local cluster -----------------------------------------------------------------------------------


def test_runs_wide_yaml_and_state(c):
    ok(astra(c, "astraeus", "run", "--name", "habit-hog", "--image", IMAGE, "--gpus", "8", "--", *SLEEP))
    ok(astra(c, "astraeus", "run", "--name", "habit-waits", "--image", IMAGE, "--gpus", "8", "--", *SLEEP))
    try:
        c.wait_for(lambda: c.run("habit-hog")["status"]["state"] == "Running", what="habit-hog running")
        lines = ok(astra(c, "astraeus", "runs", "-o", "wide")).splitlines()
        assert lines[0].split() == ["NAME", "CLUSTER", "STATE", "PRIORITY", "GPUS", "USER", "AGE", "REASON"]
        rows = {ln.split()[0]: ln.split() for ln in lines[1:]}
        assert rows["habit-hog"][1:3] == ["main", "Running"] and rows["habit-waits"][2] == "Pending"
        assert rows["habit-hog"][4] == "8" and rows["habit-hog"][5] == "admin"  # USER: who submitted it
        assert rows["habit-hog"][6][-1] in "sm"  # an age: 5s, 1m3s
        data = yaml.safe_load(ok(astra(c, "astraeus", "runs", "-o", "yaml")))
        assert {r["metadata"]["name"] for r in data["items"]} >= {"habit-hog", "habit-waits"}
        # a state in any case is the API's state
        pending = ok(astra(c, "astraeus", "runs", "--state", "pending")).splitlines()[1:]
        assert [ln.split()[0] for ln in pending] == ["habit-waits"]

        # logs of a run that has not started: nothing on stdout, a line on stderr, exit 0
        r = astra(c, "astraeus", "logs", "habit-waits")
        assert r.returncode == 0 and r.stdout == "", r
        assert r.stderr.startswith("habit-waits-0 has not started yet (") and "logs -f habit-waits" in r.stderr
        # -f waits, saying so
        e = dict(c.env)
        p = subprocess.Popen([ASTRA, "astraeus", "logs", "-f", "habit-waits"], env=e, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            line = p.stderr.readline()
            assert line.startswith("habit-waits-0 has not started yet (") and "waiting for it to start" in line
            time.sleep(1)
            assert p.poll() is None  # still waiting
        finally:
            p.kill()
            p.wait()
    finally:
        cleanup(c, "habit-hog", "habit-waits")


def test_every_field_of_a_refused_body_is_shown(c, tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump({"metadata": {"name": "habit-bad"}, "spec": {"colour": "red", "task_template": {
        "image": IMAGE, "command": "true", "shape": "round"}}}))
    err = one_line_error(astra(c, "astraeus", "run", "-f", str(p)))
    assert err.startswith("error: 422 INVALID: 2 fields to change: "), err
    assert "spec.colour: unknown field" in err and "spec.task_template.shape: unknown field" in err


def test_the_light_argument_layer_reads_as_typer_does(tmp_path):
    """The hot commands skip click (astraeus.cli.fastargs); with ASTRA_NO_FASTARGS=1 typer reads them: the same
    outputs, the same refusals (those the layer leaves to typer included)."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH --container-image=python:3.11\n#SBATCH -G 2\nhostname\n")
    lines = [
        ["astraeus", "run", "--name", "x", "--image", "i", "--gpus", "2", "--env", "A=1", "--env", "B=2", "--dry-run",
         "--", "python", "-c", "print(1)", "--gpus", "3"],
        ["astraeus", "run", "--dry-run", "--name=x", "--image=i", "--cpus", "0.5", "--", "true"],
        ["astraeus", "run", "--name", "x", "--image", "i", "--gpus", "two", "--", "true"],  # typer's usage error
        ["astraeus", "runs", "--limit", "0"],  # a bound: typer's
        ["astraeus", "runs", "-o", "xml"],
        ["astraeus", "runs", "--bogus"],
        ["astraeus", "logs"],  # a missing argument: typer's
        ["astraeus", "logs", "w", "--tail", "-1"],
        ["slurm", "sbatch", "--dry-run", "-J", "fast", str(script), "a", "b"],
        ["slurm", "sbatch", "--dry-run", "--wrap", "echo hi", "--container-image", "python:3.11"],
        ["slurm", "squeue", "--bogus"],
        ["slurm", "squeue", "stray", "--bogus"],
        ["slurm", "squeue", "-j", "x", "-t", "PD", "--me"],
        ["astraeus", "runs", "-o", "xml", "-w"],
        ["astraeus", "runs", "-o", "yaml", "--watch", "-l", "a=b", "--state", "Running"],
        ["astraeus", "logs", "w", "-f", "--tail", "3", "--timestamps"],
    ]
    for line in lines:
        fast = bare(*line)
        slow = bare(*line, env={"ASTRA_NO_FASTARGS": "1"})
        assert (fast.returncode, fast.stdout, fast.stderr) == (slow.returncode, slow.stdout, slow.stderr), line


def test_the_hot_commands_answer_alike_through_the_entry_module_and_typer(c, tmp_path):
    """`astra` (astraeus.cli.main: the hot commands without typer) and typer's app (ASTRA_NO_FASTARGS=1) give the
    same output and exit code against a cluster: a submit, runs, logs, sbatch, squeue, and their refusals."""
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\n#SBATCH --container-image={IMAGE}\necho hi\n")
    ok(astra(c, "astraeus", "run", "--name", "entry-logs", "--image", IMAGE, "--", "python3", "-c", "print(1)"))
    c.wait_for(lambda: astra(c, "astraeus", "logs", "entry-logs").stdout == "1\n", timeout=60, what="its output")
    try:
        for how, line in (
            ("submit", ["astraeus", "run", "--name", "entry-{}", "--image", IMAGE, "--", "true"]),
            ("submit", ["slurm", "sbatch", "--job-name=entry-sb-{}", str(script)]),
            ("same", ["astraeus", "runs", "--limit", "3"]),
            ("same", ["astraeus", "runs", "-o", "json", "-l", "nope=1"]),
            ("same", ["astraeus", "logs", "entry-logs", "--tail", "1"]),
            ("same", ["astraeus", "logs", "entry-missing"]),
            ("same", ["slurm", "squeue", "-j", "entry-logs"]),
            ("same", ["slurm", "squeue", "--bogus"]),
        ):
            if line[:2] == ["astraeus", "runs"]:  # the submitted runs ended: both read the same states
                c.wait_for(lambda: all(c.run(n)["status"]["state"] == "Completed" for n in (
                    "entry-fast", "entry-slow", "entry-sb-fast", "entry-sb-slow")), timeout=60, what="the runs' end")
            fast = astra(c, *[x.format("fast") for x in line])
            slow = astra(c, *[x.format("slow") for x in line], env={"ASTRA_NO_FASTARGS": "1"})
            if how == "submit":  # each submits its own run: the same line but for the name
                fast_out = fast.stdout.replace("entry-fast", "entry-slow").replace("entry-sb-fast", "entry-sb-slow")
                assert (fast.returncode, fast_out, fast.stderr) == (slow.returncode, slow.stdout, slow.stderr), line
                assert fast.returncode == 0, fast.stderr
            else:
                assert (fast.returncode, fast.stdout, fast.stderr) == (slow.returncode, slow.stdout, slow.stderr), line
    finally:
        cleanup(c, "entry-logs", "entry-fast", "entry-slow", "entry-sb-fast", "entry-sb-slow")


def test_the_entry_module_runs_hot_commands_without_typer(tmp_path):
    """A hot command through astraeus.cli.main imports neither typer, click, rich nor pydantic, nor the standard
    library's slow starters (typing, dataclasses, pathlib, difflib, inspect, subprocess, threading); hot_table (the
    options it reads them by) is what fastargs derives from typer's app today."""
    heavy = "{'typer', 'click', 'rich', 'pydantic', 'typing', 'dataclasses', 'pathlib', 'difflib', 'inspect', " \
            "'subprocess', 'threading'}"
    code = ("import sys; sys.argv = ['astra', 'slurm', 'sbatch', '--dry-run', '--wrap', 'true', '--container-image', "
            "'i']\nfrom astraeus.cli import main\nmain.app()\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {heavy}), file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "ASTRAEUS_CONFIG": "/nonexistent"})
    assert r.returncode == 0 and r.stderr.splitlines()[-1] == "[]", r.stderr
    from astraeus.cli import fastargs, hot_table
    from astraeus.cli.astra import app

    # if this fails: python -m astraeus.cli.make_hot_table > src/astraeus/cli/hot_table.py
    assert fastargs.render_table(app) == Path(hot_table.__file__).read_text()


@pytest.mark.parametrize("argv", [[], ["--help"], ["astraeus", "--help"], ["slurm", "sbatch", "--help"]])
def test_kept_help_is_typers_help(argv):
    """`astra --help` and the like print what hot_table keeps: the same text and exit code as typer's own."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    astra = str(Path(sys.executable).parent / "astra")
    kept = subprocess.run([astra, *argv], capture_output=True, text=True, timeout=60, env=env)
    typers = subprocess.run([astra, *argv], capture_output=True, text=True, timeout=60,
                            env={**env, "ASTRA_NO_FASTARGS": "1"})
    assert (kept.returncode, kept.stdout, kept.stderr) == (typers.returncode, typers.stdout, typers.stderr)
    assert "Usage: astra" in kept.stdout or "astra slurm sbatch" in kept.stdout


def test_kept_help_only_where_it_is_exact():
    from astraeus.cli.fastargs import HELP_WIDTH, help_cached

    helps = {"--help": (0, "text")}
    assert help_cached(helps, ["--help"], None, None) == (0, "text")  # a pipe
    assert help_cached(helps, ["--help"], None, HELP_WIDTH + 40) == (0, "text")  # a wide terminal: the same words
    assert help_cached(helps, ["--help"], None, HELP_WIDTH - 1) is None  # narrower: typer wraps it
    assert help_cached(helps, ["--help"], "120", None) is None  # another width asked
    assert help_cached(helps, ["astraeus", "describe", "--help"], None, None) is None  # not kept
