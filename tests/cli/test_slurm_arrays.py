"""`astra slurm sbatch --array` and `--dependency`: Slurm's forms parsed into runs (one per index, each with its
`spec.array`) and the run spec's `dependency`; bad input is one `sbatch: error:` line saying what to write; squeue's
and scancel's job forms (`job_3`, `job_[0-9]`, `job`)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from astraeus import spec as S
from astraeus.cli.astra import app
from astraeus.cli.slurm import (
    SbatchError,
    build_job,
    job_matcher,
    parse_array,
    parse_command_line,
    parse_dependency,
    split_jobs,
)

SCRIPT = "#!/bin/bash\n#SBATCH --job-name=train\n#SBATCH --container-image=busybox\necho $SLURM_ARRAY_TASK_ID\n"


def job(argv, script=SCRIPT):
    return build_job(parse_command_line([*argv, "train.sbatch"]), script, "train.sbatch")


# --- --array ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "indices", "limit"), [
    ("0-99%10", list(range(100)), 10),
    ("1,3,5-7", [1, 3, 5, 6, 7], None),
    ("0-15:4", [0, 4, 8, 12], None),
    ("7", [7], None),
    ("0-3,2-5%2", [0, 1, 2, 3, 4, 5], 2),
    ("0-999", list(range(1000)), None),
])
def test_array_forms(text, indices, limit):
    a = parse_array(text)
    assert list(a.indices) == indices and a.max_running == limit


def test_array_indices_are_shown_as_slurm_writes_them():
    assert parse_array("1,3,5-7").shown() == "1,3,5-7"
    assert parse_array("0-15:4").shown() == "0,4,8,12"
    assert parse_array("0-19%4").shown() == "0-19"


@pytest.mark.parametrize(("text", "says"), [
    ("", "use 0-99, 1,3,5-7, 0-15:4, with %N for at most N at once"),
    ("a-b", "use 0-99, 1,3,5-7"),
    ("-1", "use 0-99"),
    ("1-", "use 0-99"),
    ("1,,2", "use 0-99"),
    ("5-1", "the range 5-1 ends before it starts: write 1-5"),
    ("0-15:0", "a step of 0 in 0-15:0: give 1 or more"),
    ("0-9%0", "after % give how many may run at once, 1 or more"),
    ("0-9%x", "after % give how many may run at once"),
    ("0-1000", "more than 1000 tasks: astra slurm submits at most 1000 runs per array"),
    ("0-2000000", "indices go up to 1000000"),
])
def test_bad_array_is_a_clear_error(text, says):
    with pytest.raises(SbatchError) as e:
        parse_array(text)
    assert str(e.value).startswith("sbatch: error: ") and says in str(e.value)


def test_an_array_job_is_one_run_per_index_each_with_its_array():
    j = job(["--array=0-19%4"])
    bodies = j.bodies()
    assert [b["metadata"]["name"] for b in bodies] == [f"train_{i}" for i in range(20)]
    assert bodies[3]["spec"]["array"] == {"job": "train", "index": 3, "count": 20, "min_index": 0, "max_index": 19,
                                          "max_running": 4}
    assert bodies[3]["spec"]["task_template"]["args"] == ["/astraeus/slurm/train.sbatch"]
    for b in bodies:  # what the API takes: each body is a valid run
        S.RunCreate.model_validate(b)


def test_array_from_an_sbatch_line_and_the_command_line_wins():
    script = SCRIPT.replace("#SBATCH --job-name=train\n", "#SBATCH --job-name=train\n#SBATCH --array=1,3,5-7\n")
    j = job([], script)
    assert [b["spec"]["array"]["index"] for b in j.bodies()] == [1, 3, 5, 6, 7]
    assert j.bodies()[0]["spec"]["array"] == {"job": "train", "index": 1, "count": 5, "min_index": 1, "max_index": 7}
    assert [b["metadata"]["name"] for b in job(["-a", "0-15:4"], script).bodies()] == [
        "train_0", "train_4", "train_8", "train_12"]


def test_an_array_in_a_bad_sbatch_line_names_the_line():
    script = SCRIPT.replace("#SBATCH --job-name=train\n", "#SBATCH --job-name=train\n#SBATCH --array=9-1\n")
    with pytest.raises(SbatchError) as e:
        job([], script)
    assert str(e.value) == ("sbatch: error: invalid --array='9-1': the range 9-1 ends before it starts: write 1-9 "
                            "(#SBATCH line 3 of train.sbatch)")


def test_a_job_name_too_long_for_its_array_runs_is_refused():
    with pytest.raises(SbatchError, match="give a shorter --job-name"):
        job(["-J", "x" * 62, "--array=0-10"])


def test_without_array_one_run_as_before():
    j = job([])
    assert j.array is None and j.bodies() == [j.spec] and "array" not in j.spec["spec"]


def test_the_api_refuses_an_array_name_that_its_array_does_not_say():
    b = job(["--array=0-3"]).bodies()[2]
    b["metadata"]["name"] = "train_9"
    with pytest.raises(ValueError, match="name 'train_9' is not a DNS label"):
        S.RunCreate.model_validate(b)
    b["metadata"]["name"] = "train_2"
    b["spec"]["array"]["index"] = 30
    with pytest.raises(ValueError, match=r"index 30 is outside the array's indices 0-3"):
        S.RunCreate.model_validate(b)


# --- --dependency -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "dep"), [
    ("afterok:prep", {"type": "afterok", "runs": ["prep"]}),
    ("afterok:prep:download:prep", {"type": "afterok", "runs": ["prep", "download"]}),
    ("afterany:train", {"type": "afterany", "runs": ["train"]}),
    ("afternotok:train_3", {"type": "afternotok", "runs": ["train_3"]}),
    ("singleton", {"type": "singleton"}),
])
def test_dependency_forms(text, dep):
    assert parse_dependency(text) == dep
    assert job([f"--dependency={text}"]).spec["spec"]["dependency"] == dep
    S.DependencySpec.model_validate(dep)


@pytest.mark.parametrize(("text", "says"), [
    ("afterok", "afterok needs the jobs it waits for, e.g. --dependency=afterok:prep"),
    ("afterok:", "afterok needs the jobs it waits for"),
    ("afterok:a::b", "afterok needs the jobs it waits for"),
    ("afterok:a,afterany:b", "astra slurm takes one dependency type with its jobs"),
    ("afterok:a?afterany:b", "astra slurm takes one dependency type"),
    ("after:prep", "dependency type 'after' is not supported by astra slurm: use afterany"),
    ("aftercorr:prep", "dependency type 'aftercorr' is not supported"),
    ("afterburst:prep", "give afterok:JOB[:JOB…], afterany:JOB…, afternotok:JOB… or singleton"),
    ("afterok:prep+10", "delays (+MINUTES) are not supported"),
    ("afterok:Prep", "'Prep' is not a job: give run names"),
    ("afterok:12_x", "'12_x' is not a job"),
    ("singleton:x", "singleton names no jobs"),
])
def test_bad_dependency_is_a_clear_error(text, says):
    with pytest.raises(SbatchError) as e:
        parse_dependency(text)
    assert str(e.value).startswith(f"sbatch: error: --dependency={text}") and says in str(e.value)


# --- squeue -j / scancel job forms ------------------------------------------------------------------------------


RUNS = [("prep", None, None), ("train_0", "train", 0), ("train_3", "train", 3), ("train_12", "train", 12),
        ("trainer", None, None)]


@pytest.mark.parametrize(("arg", "names"), [
    ("train", ["train_0", "train_3", "train_12"]),
    ("train_3", ["train_3"]),
    ("train_[0-9]", ["train_0", "train_3"]),
    ("train_[3,12]", ["train_3", "train_12"]),
    ("prep", ["prep"]),
    ("train_[13-20]", []),
])
def test_job_forms(arg, names):
    test = job_matcher(arg)
    assert [n for n, a, i in RUNS if test(n, a, i)] == names


def test_a_bad_job_form_is_a_clear_error():
    with pytest.raises(SbatchError) as e:
        job_matcher("train_[x]", "scancel")
    assert str(e.value) == "scancel: error: invalid job 'train_[x]': write an array's tasks as JOB_[0-9], JOB_[1,3,5-7]"


def test_jobs_split_at_commas_outside_brackets():
    assert split_jobs("prep,train_[1,3],b") == ["prep", "train_[1,3]", "b"]


# --- the command ------------------------------------------------------------------------------------------------

runner = CliRunner()


def invoke(args):
    env = {"ASTRAEUS_API": "", "ASTRAEUS_TOKEN": "", "ASTRAEUS_CONFIG": "/nonexistent/astra.json"}
    return runner.invoke(app, args, env=env)


def test_sbatch_dry_run_prints_each_run_of_the_array(tmp_path):
    p = tmp_path / "train.sbatch"
    p.write_text(SCRIPT)
    r = invoke(["slurm", "sbatch", "--array=0-2%2", "--dependency=afterok:prep", "--dry-run", str(p)])
    assert r.exit_code == 0, r.output
    bodies = json.loads(r.stdout)
    assert [b["metadata"]["name"] for b in bodies] == ["train_0", "train_1", "train_2"]
    assert all(b["spec"]["dependency"] == {"type": "afterok", "runs": ["prep"]} for b in bodies)
    assert bodies[1]["spec"]["array"]["max_running"] == 2


@pytest.mark.parametrize(("args", "line"), [
    (["--array=5-1"], "sbatch: error: invalid --array='5-1': the range 5-1 ends before it starts: write 1-5"),
    (["--dependency=after:prep"], "sbatch: error: --dependency=after:prep: dependency type 'after' is not supported "
                                  "by astra slurm: use afterany (after the jobs end) or afterok (after they complete)"),
])
def test_sbatch_bad_array_or_dependency_is_one_error_line(tmp_path, args, line):
    p = tmp_path / "train.sbatch"
    p.write_text(SCRIPT)
    r = invoke(["slurm", "sbatch", *args, "--dry-run", str(p)])
    assert r.exit_code == 1
    assert r.stderr == line + "\n"
