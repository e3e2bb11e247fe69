"""`astra slurm sbatch`'s parsing: Slurm's formats, #SBATCH lines, and refusals by name."""

import pytest

from astraeus.cli.slurm import (
    SbatchError,
    build_job,
    default_name,
    directives,
    parse_command_line,
    parse_mem,
    parse_time,
)

GIB = 1024**3


def job(argv, script, label="job.sbatch"):
    return build_job(parse_command_line(argv), script, label)


# --- time and memory formats ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text,seconds", [
    ("30", 1800),                 # MM
    ("90", 5400),
    ("5:30", 330),                # MM:SS
    ("1:00:00", 3600),            # HH:MM:SS
    ("48:00:00", 172800),
    ("2-0", 172800),              # D-HH
    ("1-12", 129600),
    ("1-12:30", 131400),          # D-HH:MM
    ("1-00:00:30", 86430),        # D-HH:MM:SS
    ("00:20:00", 1200),
])
def test_time_formats(text, seconds):
    assert parse_time(text) == seconds


@pytest.mark.parametrize("text", ["0", "UNLIMITED", "infinite", "0:00:00"])
def test_time_no_limit(text):
    assert parse_time(text) is None


@pytest.mark.parametrize("text", ["1h", "20m", "", "1:2:3:4", "a-1", "1-", "-1", "1.5", "1-2:3:4:5"])
def test_bad_time_is_a_clear_error(text):
    with pytest.raises(SbatchError) as e:
        parse_time(text)
    assert str(e.value).startswith("sbatch: error: invalid time --time=")
    assert "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS" in str(e.value)


@pytest.mark.parametrize("text,nbytes", [
    ("16G", 16 * GIB), ("16g", 16 * GIB), ("500M", 500 * 1024**2), ("1T", 1024**4), ("64K", 64 * 1024),
    ("4000", 4000 * 1024**2),     # a plain number is megabytes, as in Slurm
    ("32GB", 32 * GIB),
])
def test_mem_formats(text, nbytes):
    assert parse_mem(text) == nbytes


@pytest.mark.parametrize("text", ["16 GiB", "lots", "1.5G", "16X", "", "-1G"])
def test_bad_mem_is_a_clear_error(text):
    with pytest.raises(SbatchError) as e:
        parse_mem(text)
    assert str(e.value).startswith("sbatch: error: invalid memory --mem=")
    assert "16G" in str(e.value)


def test_mem_zero_is_refused():
    with pytest.raises(SbatchError, match=r"--mem=0 .*not supported"):
        parse_mem("0")


# --- #SBATCH lines ----------------------------------------------------------------------------------------------

FINETUNE = """#!/bin/bash
#SBATCH --job-name=ft-lowprio
#SBATCH --container-image=nvcr.io/nvidia/pytorch:24.08-py3
#SBATCH --gres=gpu:8
#SBATCH --cpus-per-task=64        # all cores
#SBATCH --mem=512G
#SBATCH --time=2-00:00:00
#SBATCH --output=logs/%x-%j.out
#SBATCH --error=logs/%x-%j.err

set -euo pipefail
#SBATCH --time=00:05:00
exec torchrun --nproc-per-node=8 train.py "$@"
"""


def test_sbatch_lines_until_the_first_command():
    lines = directives(FINETUNE)
    assert [n for n, _ in lines] == [2, 3, 4, 5, 6, 7, 8, 9]
    assert lines[3] == (5, ["--cpus-per-task=64"])  # the trailing comment is dropped


def test_finetune_script_becomes_a_run():
    j = job(["--nice=100", "finetune.sbatch", "--lr", "3e-4", "a b"], FINETUNE)
    assert j.name == "ft-lowprio"
    spec = j.spec["spec"]
    assert j.spec["metadata"] == {"name": "ft-lowprio"}
    assert spec["priority"] == -100
    assert spec["start"] == "Gang"
    tt = spec["task_template"]
    assert tt["image"] == "nvcr.io/nvidia/pytorch:24.08-py3"
    assert tt["command"] == "bash"
    assert tt["args"] == ["/astraeus/slurm/ft-lowprio.sbatch", "--lr", "3e-4", "a b"]
    assert tt["configs"] == [{"mounts": ["/astraeus/slurm/ft-lowprio.sbatch"], "value": FINETUNE}]
    assert tt["time_limit_seconds"] == 172800  # the #SBATCH --time after `set -euo pipefail` is ignored
    assert tt["restart_policy"] == "Never"
    assert tt["requested_resources"] == {
        "cpu_cores": 64, "memory_bytes": 512 * GIB, "gpu_requests": {"count": 8}, "machines": 1,
        "node_selection": {"mode": "Any"},
    }
    assert any("--output and --error ignored" in n for n in j.notes)


def test_name_defaults_to_the_script_stem():
    script = "#!/bin/bash\n#SBATCH --container-image=img\n#SBATCH --gres=gpu:8\npython train.py\n"
    j = job(["--nice=100", "finetune.sbatch"], script, "finetune.sbatch")
    assert j.name == "finetune"
    assert j.spec["spec"]["priority"] == -100
    assert j.spec["spec"]["task_template"]["args"] == ["/astraeus/slurm/finetune.sbatch"]
    assert "cluster" not in j.spec["spec"]
    assert "time_limit_seconds" not in j.spec["spec"]["task_template"]


@pytest.mark.parametrize("path,name", [
    ("finetune.sbatch", "finetune"), ("jobs/train.sh", "train"), ("Train_GPT.slurm", "train-gpt"),
    ("run", "run"), ("___.sh", "sbatch"),
])
def test_default_name(path, name):
    assert default_name(path, wrap=False) == name


def test_command_line_wins_over_sbatch_lines():
    script = ("#!/bin/bash\n#SBATCH -J from-script\n#SBATCH -t 10\n#SBATCH --mem=8G\n"
              "#SBATCH -p small\n#SBATCH --container-image=img:1\npython x.py\n")
    j = job(["-J", "from-cli", "--time=1:00:00", "--mem", "16G", "--partition=a100", "s.sh"], script)
    assert j.name == "from-cli"
    spec = j.spec["spec"]
    assert spec["task_template"]["requested_resources"]["node_selection"]["pools"] == ["a100"]
    assert spec["task_template"]["time_limit_seconds"] == 3600
    assert spec["task_template"]["requested_resources"]["memory_bytes"] == 16 * GIB


def test_short_options_attached_and_separate():
    script = "#!/bin/bash\n#SBATCH -Jshort -c8 -t 30\n#SBATCH -N 1 -p main\n#SBATCH --container-image img\nhostname\n"
    j = job(["s.sh"], script)
    assert j.name == "short"
    rr = j.spec["spec"]["task_template"]["requested_resources"]
    assert rr["cpu_cores"] == 8 and rr["machines"] == 1
    assert j.spec["spec"]["task_template"]["time_limit_seconds"] == 1800


def test_multi_node_gang():
    # The kind of script public LLM repos carry: 2 nodes × 8 GPUs, per-node memory and CPUs.
    script = """#!/bin/bash
#SBATCH --job-name=llama-pretrain
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=96
#SBATCH --mem=1000G
#SBATCH --time=72:00:00
#SBATCH --container-image=nvcr.io#nvidia/pytorch:24.08-py3
#SBATCH --output=%x-%j.out

export MASTER_PORT=29500
torchrun --nnodes 2 --nproc-per-node 8 pretrain.py
"""
    j = job(["pretrain.sbatch"], script)
    tt = j.spec["spec"]["task_template"]
    assert tt["image"] == "nvcr.io/nvidia/pytorch:24.08-py3"  # pyxis' registry#image
    assert tt["time_limit_seconds"] == 72 * 3600
    assert tt["requested_resources"] == {
        "cpu_cores": 192, "memory_bytes": 2000 * GIB,
        "gpu_requests": {"count": 16, "min_per_machine": 8}, "machines": 2, "node_selection": {"mode": "Any"},
    }


def test_gpus_total_and_per_gpu_resources():
    script = "#!/bin/bash\n#SBATCH --gpus=4\n#SBATCH --cpus-per-gpu=8\n#SBATCH --mem-per-gpu=40G\n" \
             "#SBATCH --container-image=img\npython x.py\n"
    rr = job(["x.sh"], script).spec["spec"]["task_template"]["requested_resources"]
    assert rr["gpu_requests"] == {"count": 4}
    assert rr["cpu_cores"] == 32
    assert rr["memory_bytes"] == 160 * GIB


def test_mem_per_cpu():
    script = "#!/bin/bash\n#SBATCH -c 4\n#SBATCH --mem-per-cpu=2000\n#SBATCH --container-image=img\nx\n"
    rr = job(["x.sh"], script).spec["spec"]["task_template"]["requested_resources"]
    assert rr["memory_bytes"] == 4 * 2000 * 1024**2


def test_gres_without_count_is_one_gpu():
    script = "#!/bin/bash\n#SBATCH --gres=gpu\n#SBATCH --container-image=img\nx\n"
    assert job(["x.sh"], script).spec["spec"]["task_template"]["requested_resources"]["gpu_requests"] == {"count": 1}


def test_nice_forms():
    script = "#!/bin/bash\n#SBATCH --container-image=img\nx\n"
    assert job(["--nice=-60", "x.sh"], script).spec["spec"]["priority"] == 60
    assert job(["--nice", "x.sh"], script).spec["spec"]["priority"] == -100  # Slurm's default adjustment
    assert job(["--nice", "-60", "x.sh"], script).spec["spec"]["priority"] == 60
    assert "priority" not in job(["x.sh"], script).spec["spec"]


def test_wrap():
    j = build_job(parse_command_line(["--wrap", "python -c 'print(1)'", "--container-image=img"]), "", "--wrap")
    assert j.name == "wrap"
    assert "python -c 'print(1)'" in j.spec["spec"]["task_template"]["configs"][0]["value"]


def test_script_args_are_kept_exactly_even_when_they_look_like_options():
    script = "#!/bin/bash\n#SBATCH --container-image=img\nx\n"
    j = job(["-J", "a", "x.sh", "--time=5", "-J", "b", "it's \"quoted\""], script)
    assert j.name == "a"
    assert j.spec["spec"]["task_template"]["args"][1:] == ["--time=5", "-J", "b", "it's \"quoted\""]


def test_comment_and_hash_handling_in_sbatch_lines():
    script = ("#!/bin/bash\n# a comment\n\n#SBATCH --job-name='my job name'  # trailing\n"
              "#SBATCHX --array=1-3\n# SBATCH --array=1-3\n#SBATCH --container-image=img\ncmd\n")
    assert directives(script) == [(4, ["--job-name=my job name"]), (7, ["--container-image=img"])]


def test_a_script_without_sbatch_lines():
    assert directives("#!/bin/bash\necho hi\n#SBATCH --array=1-2\n") == []


# --- refusals --------------------------------------------------------------------------------------------------

UNSUPPORTED = [
    "--account=proj", "--qos=high", "--exclusive",
    "--mail-type=ALL", "--mail-user=a@b.c", "--export=ALL", "--container-mounts=/data:/data", "--requeue",
    "--signal=B:USR1@60", "--chdir=/tmp", "--begin=now+1hour", "--exclude=gpu-01",
    "--nodelist=gpu-01", "--hint=nomultithread", "--distribution=block", "--wait", "--open-mode=append",
    "--gpu-bind=closest", "--mem-bind=local", "--licenses=x", "--comment=x", "--priority=10", "--deadline=now",
    "--cpu-freq=high", "--container-workdir=/w", "--parsable", "--hold", "--no-requeue",
]


@pytest.mark.parametrize("opt", UNSUPPORTED)
def test_unsupported_option_on_command_line_is_refused_by_name(opt):
    name = opt.split("=")[0]
    with pytest.raises(SbatchError) as e:
        parse_command_line([opt, "x.sh"])
    assert str(e.value).startswith(f"sbatch: option {name} is not supported by astra slurm")


@pytest.mark.parametrize("opt", UNSUPPORTED)
def test_unsupported_option_in_sbatch_line_is_refused_by_name(opt):
    name = opt.split("=")[0]
    script = f"#!/bin/bash\n#SBATCH --container-image=img\n#SBATCH {opt}\necho\n"
    with pytest.raises(SbatchError) as e:
        job(["x.sh"], script, "x.sh")
    assert str(e.value).startswith(f"sbatch: option {name} is not supported by astra slurm")
    assert "#SBATCH line 3 of x.sh" in str(e.value)


def test_exclusive_message_exactly():
    with pytest.raises(SbatchError) as e:
        parse_command_line(["--exclusive", "x.sh"])
    assert str(e.value).startswith("sbatch: option --exclusive is not supported by astra slurm")


@pytest.mark.parametrize("opt", ["-A", "-w", "-x", "-q", "-D", "-W", "-H", "-k", "-s"])
def test_unsupported_short_options(opt):
    with pytest.raises(SbatchError) as e:
        parse_command_line([opt, "v", "x.sh"])
    assert str(e.value).startswith(f"sbatch: option {opt} is not supported by astra slurm")


@pytest.mark.parametrize("argv,needle", [
    (["--gres=gpu:a100:h100:4", "x.sh"], "invalid --gres='gpu:a100:h100:4': use --gres=gpu:N or --gres=gpu:TYPE:N"),
    (["--gres=gpu:a100:2,gpu:h100:2", "x.sh"], "one GPU type per job"),
    (["--gres=gpu:a100:0", "x.sh"], "a GPU type with 0 GPUs"),
    (["--gpus=a100:four", "x.sh"], "invalid --gpus"),
    (["--gpus=a:b:c", "x.sh"], "give a count of GPUs (N) or a type and a count (TYPE:N"),
    (["--gpus-per-node=a+b:2", "x.sh"], "'a+b' is not a GPU type"),
    (["--gres=mps:100", "x.sh"], "knows only GPUs"),
    (["--partition=A100", "x.sh"], "'A100' is not a pool's name"),
    (["--partition=a,", "x.sh"], "'' is not a pool's name"),
    (["--clusters=a,b", "x.sh"], "submits to one cluster"),
    (["--constraint=a|b", "x.sh"], "alternatives (|) are not supported"),
    (["--constraint=gpu=", "x.sh"], "'gpu=' is not a feature"),
    (["--constraint=a&&b", "x.sh"], "'' is not a feature"),
    (["--constraint=gpu=a100&gpu=h100", "x.sh"], "gpu is given twice"),
    (["--reservation=Launch Day", "x.sh"], "invalid --reservation='Launch Day'"),
    (["--nodes=2-4", "x.sh"], "node ranges are not supported"),
    (["--ntasks-per-node=8", "x.sh"], "one task per node"),
    (["--ntasks=4", "x.sh"], "one task per node"),
    (["--cpus-per-task=0", "x.sh"], "invalid --cpus-per-task"),
    (["-c", "four", "x.sh"], "invalid --cpus-per-task"),
    (["--nice=abc", "x.sh"], "invalid --nice"),
    (["--time=1h", "x.sh"], "invalid time --time='1h'"),
    (["--mem=16GiB", "x.sh"], "invalid memory --mem='16GiB'"),
    (["--mem=16G", "--mem-per-cpu=1G", "x.sh"], "mutually exclusive"),
    (["--cpus-per-gpu=4", "x.sh"], "--cpus-per-gpu needs GPUs"),
    (["-J"], "-J needs a value"),
])
def test_bad_values_are_clear_errors(argv, needle):
    script = "#!/bin/bash\n#SBATCH --container-image=img\nx\n"
    with pytest.raises(SbatchError) as e:
        job(argv, script)
    assert needle in str(e.value)
    assert str(e.value).startswith("sbatch: ")


def test_bad_time_in_a_sbatch_line_names_the_line():
    with pytest.raises(SbatchError) as e:
        job(["x.sh"], "#!/bin/bash\n#SBATCH --container-image=img\n#SBATCH -t 2h\nx\n", "x.sh")
    assert "invalid time --time='2h'" in str(e.value) and "#SBATCH line 3 of x.sh" in str(e.value)


def test_no_image_is_refused():
    with pytest.raises(SbatchError, match="no container image"):
        job(["x.sh"], "#!/bin/bash\nx\n")


def test_wrap_in_a_sbatch_line_is_refused():
    with pytest.raises(SbatchError, match="option --wrap is not supported"):
        job(["x.sh"], "#!/bin/bash\n#SBATCH --wrap=hostname\nx\n")


def test_help_is_recognised():
    from astraeus.cli.slurm import HelpRequested

    with pytest.raises(HelpRequested):
        parse_command_line(["--help"])


# --- pools, features, GPU types, reservations, --test-only (issue 18) -------------------------------------------

IMG = "#!/bin/bash\n#SBATCH --container-image=img\nx\n"


def _rr(argv, script=IMG):
    return job([*argv, "x.sh"], script).spec["spec"]["task_template"]["requested_resources"]


def test_partition_is_pools_and_clusters_is_the_cluster():
    j = job(["--partition=a100,h100,a100", "-M", "east", "x.sh"], IMG)
    assert j.spec["spec"]["cluster"] == "east"
    assert j.spec["spec"]["task_template"]["requested_resources"]["node_selection"] == {
        "mode": "Any", "pools": ["a100", "h100"]}
    assert j.partition == "a100,h100"
    assert "cluster" not in job(["-p", "a100", "x.sh"], IMG).spec["spec"]


def test_constraint_is_labels_and_a_bare_feature_is_true():
    assert _rr(["--constraint=gpu=a100&ib"])["node_selection"] == {"mode": "Labels",
                                                                   "labels": {"gpu": "a100", "ib": "true"}}
    assert _rr(["-C", "nvlink"])["node_selection"] == {"mode": "Labels", "labels": {"nvlink": "true"}}


def test_gpu_types_become_the_gpu_model():
    assert _rr(["--gres=gpu:a100:4"])["gpu_requests"] == {"count": 4, "model": "a100"}
    assert _rr(["--gres=gpu:h100"])["gpu_requests"] == {"count": 1, "model": "h100"}
    assert _rr(["--gpus=a100:8"])["gpu_requests"] == {"count": 8, "model": "a100"}
    assert _rr(["--gpus-per-node=H100:2", "-N", "2"])["gpu_requests"] == {"count": 4, "model": "H100",
                                                                          "min_per_machine": 2}
    assert _rr(["--gres=gpu:4"])["gpu_requests"] == {"count": 4}


def test_reservation_and_the_other_selections_in_sbatch_lines():
    script = ("#!/bin/bash\n#SBATCH --container-image=img\n#SBATCH --reservation=launch\n#SBATCH -p a100\n"
              "#SBATCH --constraint=ib\n#SBATCH --gres=gpu:a100:2\nx\n")
    rr = _rr([], script)
    assert rr["node_selection"] == {"mode": "Labels", "labels": {"ib": "true"}, "pools": ["a100"],
                                    "reservation": "launch"}
    assert rr["gpu_requests"] == {"count": 2, "model": "a100"}


def test_with_a_template_only_the_selection_given_is_sent():
    rr = _rr(["--template=ft", "-p", "a100"], "#!/bin/bash\nx\n")
    assert rr == {"node_selection": {"pools": ["a100"]}}


def test_test_only_is_a_command_line_option():
    j = job(["--test-only", "-c", "4", "x.sh"], IMG)
    assert j.test_only and j.processors == 4
    assert job(["-N", "2", "x.sh"], IMG).processors == 2
    with pytest.raises(SbatchError, match="option --test-only is not supported"):
        job(["x.sh"], "#!/bin/bash\n#SBATCH --test-only\n#SBATCH --container-image=img\nx\n")


def test_test_only_lines_as_slurm_prints_them():
    from astraeus.cli import format as fmt

    starts = {"outcome": "Starts", "cluster": "main",
              "placements": [{"worker": "j-0", "machine": "gpu-01", "gpu_indices": [0]},
                             {"worker": "j-1", "machine": "gpu-02", "gpu_indices": [0]}]}
    line, ok = fmt.sbatch_test_only(starts, "j", 16, None)
    assert ok and line.startswith("sbatch: Job j to start at 20") and line.endswith(
        " using 16 processors on nodes gpu-01,gpu-02 in partition main")
    head = {"outcome": "Head", "cluster": "main", "starts_by": "2026-12-01T10:00:00Z", "placements": []}
    assert fmt.sbatch_test_only(head, "j", 1, "a100") == (
        "sbatch: Job j to start at 2026-12-01T10:00:00 using 1 processors in partition a100", True)
    waits = {"outcome": "Waits", "reason": "Waits for namespace quota: gpus 1 in use + 2 asked > 2"}
    assert fmt.sbatch_test_only(waits, "j", 1, None) == (
        "sbatch: Job j would not start: Waits for namespace quota: gpus 1 in use + 2 asked > 2", False)
    unknown = {"outcome": "Head", "reason": "Next to run (priority 0): when running work ends", "starts_by": None}
    assert fmt.sbatch_test_only(unknown, "j", 1, None)[1] is False
