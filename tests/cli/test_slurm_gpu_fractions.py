"""Issue 46: sbatch's GPU forms and fractions: --gres=gpu:N stays whole GPUs; --gres=shard:N is N/8 of one GPU;
--gpus=0.5 is half of one GPU; bad forms are refused with what to write instead."""

import pytest

from astraeus.cli.slurm import SbatchError, build_job, parse_command_line

SCRIPT = "#!/bin/bash\n#SBATCH --container-image=python:3.11\npython train.py\n"


def gpus_of(argv):
    j = build_job(parse_command_line([*argv, "job.sbatch"]), SCRIPT, "job.sbatch")
    return j.spec["spec"]["task_template"]["requested_resources"].get("gpu_requests")


@pytest.mark.parametrize("argv, asked", [
    (["--gres=gpu:2"], {"count": 2}),
    (["--gres=shard:4"], {"count": 1, "fraction": 0.5}),
    (["--gres=shard:2"], {"count": 1, "fraction": 0.25}),
    (["--gpus=0.5"], {"count": 1, "fraction": 0.5}),
    (["--gpus=a100:0.25"], {"count": 1, "fraction": 0.25, "model": "a100"}),
])
def test_gpu_forms_map_onto_whole_gpus_or_fractions(argv, asked):
    assert gpus_of(argv) == asked


@pytest.mark.parametrize("argv, words", [
    (["--gres=shard:8"], "give --gres=shard:N with N from 1 to 7"),
    (["--gres=shard:0"], "give --gres=shard:N with N from 1 to 7"),
    (["--gres=shard"], "give --gres=shard:N with N from 1 to 7"),
    (["--gpus=1.5"], "a part of one GPU is between 0 and 1"),
    (["--gpus=0.5", "--nodes=2"], "drop --nodes=2"),
])
def test_bad_fractions_say_what_to_write(argv, words):
    with pytest.raises(SbatchError) as e:
        gpus_of(argv)
    assert words in str(e.value)


def test_runs_table_and_describe_show_the_fraction():
    from astraeus.cli.format import resources_summary, runs_wide_table

    run = {"metadata": {"name": "half", "cluster": "main"}, "status": {"state": "Running"},
           "spec": {"priority": 0, "task_template": {"requested_resources": {
               "gpu_requests": {"count": 1, "fraction": 0.5}}}}}
    row = runs_wide_table([run]).splitlines()[1].split()
    assert row[:5] == ["half", "main", "Running", "0", "0.5"]
    assert resources_summary({"gpu_requests": {"count": 1, "fraction": 0.25}}) == "0.25 of one GPU (shared)"
    assert resources_summary({"gpu_requests": {"count": 2}}) == "2 GPUs"
