"""`astra slurm sbatch`'s parsing: Slurm's formats, #SBATCH lines, and refusals by name."""

import pytest

from astraeus.cli.slurm import (
    JOB_NAME_LABEL,
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
    assert any("Astraeus keeps each worker's output" in n and "read it with astra astraeus logs ft-lowprio-0" in n
               for n in j.notes)


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
    "--container-mounts=/data:/data", "--begin=now+1hour", "--nodelist=gpu-01", "--priority=10",
    "--deadline=now", "--export=PATH", "--bb=x", "--tmp=10G",
]
# The command line's alone (astra slurm sbatch acts on them there), refused in a script's #SBATCH lines.
CLI_ONLY = ["--wait", "--parsable", "--test-only", "--dry-run"]


@pytest.mark.parametrize("opt", UNSUPPORTED)
def test_unsupported_option_on_command_line_is_refused_by_name(opt):
    name = opt.split("=")[0]
    with pytest.raises(SbatchError) as e:
        parse_command_line([opt, "x.sh"])
    assert str(e.value).startswith(f"sbatch: option {name} is not supported by astra slurm")


@pytest.mark.parametrize("opt", UNSUPPORTED + CLI_ONLY)
def test_unsupported_option_in_sbatch_line_is_refused_by_name(opt):
    name = opt.split("=")[0]
    script = f"#!/bin/bash\n#SBATCH --container-image=img\n#SBATCH {opt}\necho\n"
    with pytest.raises(SbatchError) as e:
        job(["x.sh"], script, "x.sh")
    assert str(e.value).startswith(f"sbatch: option {name} is not supported by astra slurm")
    assert "#SBATCH line 3 of x.sh" in str(e.value)


def test_exclusive_without_gpus_names_the_next_step():
    with pytest.raises(SbatchError) as e:
        job(["--exclusive", "x.sh"], "#!/bin/bash\n#SBATCH --container-image=img\nx\n")
    assert "add --gpus-per-node=N with the machines' GPU count" in str(e.value)


@pytest.mark.parametrize("opt", ["-w", "-b", "-F", "-i", "-I", "-S"])
def test_unsupported_short_options(opt):
    with pytest.raises(SbatchError) as e:
        parse_command_line([opt, "v", "x.sh"])
    assert str(e.value).startswith(f"sbatch: option {opt} is not supported by astra slurm: ")


@pytest.mark.parametrize("argv,needle", [
    (["--gres=gpu:a100:h100:4", "x.sh"], "invalid --gres='gpu:a100:h100:4': use --gres=gpu:N or --gres=gpu:TYPE:N"),
    (["--gres=gpu:a100:2,gpu:h100:2", "x.sh"], "one GPU type per job"),
    (["--gres=gpu:a100:0", "x.sh"], "a GPU type with 0 GPUs"),
    (["--gpus=a100:four", "x.sh"], "invalid --gpus"),
    (["--gpus=a:b:c", "x.sh"], "give a count of GPUs (N) or a type and a count (TYPE:N"),
    (["--gpus-per-node=a+b:2", "x.sh"], "'a+b' is not a GPU type"),
    (["--gres=mps:100", "x.sh"], "knows only GPUs"),
    (["--partition=A+100", "x.sh"], "'a+100' is not a pool's name"),
    (["--partition=a,", "x.sh"], "'' is not a pool's name"),
    (["--clusters=a,b", "x.sh"], "submits to one cluster"),
    (["--constraint=a|b", "x.sh"], "alternatives (|) are not supported"),
    (["--constraint=gpu=", "x.sh"], "'gpu=' is not a feature"),
    (["--constraint=a&&b", "x.sh"], "'' is not a feature"),
    (["--constraint=gpu=a100&gpu=h100", "x.sh"], "gpu is given twice"),
    (["--reservation=Launch Day", "x.sh"], "invalid --reservation='Launch Day'"),
    (["--nodes=2-4", "x.sh"], "node ranges are not supported"),
    (["--ntasks=6", "--nodes=4", "x.sh"], "give a multiple of 4, or --ntasks-per-node"),
    (["--ntasks=4", "--ntasks-per-node=4", "--nodes=2", "x.sh"], "give --ntasks=8, or one of the two options"),
    (["--ntasks-per-gpu=2", "x.sh"], "--ntasks-per-gpu needs GPUs: add --gpus-per-node=N"),
    (["--signal=B:FOO@60", "x.sh"], "use [B:]SIG[@SECONDS]"),
    (["--open-mode=sometimes", "x.sh"], "give append or truncate"),
    (["--tiem=10", "x.sh"], "did you mean --time?"),
    (["--gpu=2", "x.sh"], "is ambiguous: did you mean --gpu-bind, --gpu-freq, --gpus"),
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


# --- options real scripts use: honoured, mapped or noted (issue 44) ---------------------------------------------

def tt_of(j):
    return j.spec["spec"]["task_template"]


@pytest.mark.parametrize("argv,per_machine,total,tasks", [
    (["--gpus-per-task=1", "--ntasks-per-node=8", "-N", "2"], 8, 16, 16),
    (["--gpus-per-task=2", "-n", "4"], 8, 8, 4),
    (["--gpus-per-task=1", "--ntasks=8", "--nodes=2"], 4, 8, 8),
    (["--gres=gpu:4", "--ntasks-per-gpu=2", "-N", "2"], 4, 8, 16),
    (["--gpus-per-node=8", "--ntasks-per-node=8", "-N", "4"], 8, 32, 32),
])
def test_tasks_and_gpus_per_task_become_gpus_per_machine(argv, per_machine, total, tasks):
    j = job([*argv, "x.sh"], IMG)
    gpu = tt_of(j)["requested_resources"]["gpu_requests"]
    assert gpu["count"] == total
    assert gpu.get("min_per_machine", per_machine) == per_machine
    assert tt_of(j)["env"]["SLURM_NTASKS"] == str(tasks)
    assert j.processors == tasks
    assert any(f"SLURM_NTASKS={tasks}" in n for n in j.notes)


def test_cpus_per_task_counts_every_task():
    j = job(["--ntasks-per-node=4", "-c", "8", "-N", "2", "x.sh"], IMG)
    assert tt_of(j)["requested_resources"]["cpu_cores"] == 64
    assert tt_of(j)["env"]["SLURM_CPUS_PER_TASK"] == "8"


@pytest.mark.parametrize("opt,says", [
    ("--account=proj", "no accounts"), ("-A proj", "no accounts"), ("--qos=high", "no QOS"), ("-q high", "no QOS"),
    ("--mail-type=END,FAIL", "sends no mail"), ("--mail-user=a@b.c", "sends no mail"),
    ("--hint=nomultithread", "no CPU binding"), ("--gpu-bind=closest", "own GPUs"), ("-L fs:1", "no licenses"),
    ("--comment=x", "not kept"), ("--exclude=gpu-01", "drain a bad machine"), ("--distribution=block", "tasks"),
])
def test_noted_options_say_what_astraeus_does_instead(opt, says):
    script = f"#!/bin/bash\n#SBATCH --container-image=img\n#SBATCH {opt}\necho\n"
    j = job(["x.sh"], script, "x.sh")
    notes = [n for n in j.notes if says in n]
    assert len(notes) == 1 and notes[0].startswith("sbatch: note: --")


def test_signal_and_no_requeue_go_into_the_spec():
    script = ("#!/bin/bash\n#SBATCH --container-image=img\n#SBATCH --signal=B:USR1@90\n#SBATCH --requeue\n"
              "#SBATCH --time=10\n#SBATCH --export=ALL\necho\n")
    j = job(["x.sh"], script)
    assert tt_of(j)["signal"] == {"name": "USR1", "seconds_before_limit": 90, "batch_only": True}
    assert "requeue" not in j.spec["spec"]  # Astraeus' default
    assert not [n for n in j.notes if "signal" in n or "requeue" in n or "export" in n]
    j = job(["--signal=USR2", "x.sh"], IMG)  # no time limit: nothing to send it before, and the job says so
    assert "signal" not in tt_of(j) and [n for n in j.notes if "--signal=USR2" in n and "--time" in n]
    j = job(["--no-requeue", "x.sh"], IMG)
    assert tt_of(j)["restart_policy"] == "Never" and j.spec["spec"]["requeue"] is False
    assert not [n for n in j.notes if "requeue" in n]


def test_exclusive_holds_the_machines_gpus():
    j = job(["--exclusive", "--gres=gpu:8", "-N", "2", "x.sh"], IMG)
    assert tt_of(j)["requested_resources"]["gpu_requests"] == {"count": 16, "min_per_machine": 8}
    assert [n for n in j.notes if "--exclusive: the job holds 8 GPU(s) per machine" in n]


def test_mem_zero_asks_for_no_set_amount():
    j = job(["--mem=0", "--gres=gpu:8", "x.sh"], IMG)
    assert "memory_bytes" not in tt_of(j)["requested_resources"]
    assert [n for n in j.notes if n.startswith("sbatch: note: --mem=0")]


def test_chdir_starts_the_script_there():
    j = job(["-D", "/workspace/run", "x.sh", "a"], IMG)
    assert tt_of(j)["args"] == ["-c", 'cd -- "$0" && exec bash "$@"', "/workspace/run", "/astraeus/slurm/x.sbatch",
                                "a"]


def test_output_patterns_are_expanded_in_the_note():
    script = ("#!/bin/bash\n#SBATCH --container-image=img\n#SBATCH --job-name=llama_train\n"
              "#SBATCH --output=logs/%x-%j.out\n#SBATCH --error=logs/%x-%A_%a.err\n#SBATCH --open-mode=append\n"
              "#SBATCH --array=3-4\necho\n")
    j = job(["x.sh"], script)
    note = [n for n in j.notes if "Astraeus keeps each worker's output" in n][0]
    assert "logs/llama_train-llama-train_3.out" in note and "logs/llama_train-llama-train_3.err" in note
    assert "astra astraeus logs llama-train_3-0" in note


@pytest.mark.parametrize("written,full", [
    ("--tim=10", "time"), ("--err=e.log", "error"), ("--job=x", "name"), ("--part=a100", "partition"),
    ("--gres-flags", None), ("--cpus-per-t=4", "cpus"),
])
def test_unambiguous_abbreviations_are_taken(written, full):
    if full is None:
        with pytest.raises(SbatchError, match="did you mean|not supported"):
            parse_command_line([written, "x.sh"])
        return
    opts, _ = parse_command_line([written, "x.sh"]).options, None
    assert full in opts.values


def test_job_names_are_kept_and_runs_get_a_valid_name():
    j = job(["-J", "llama_train", "x.sh"], IMG)
    assert j.name == "llama-train" and j.job_name == "llama_train"
    assert j.spec["metadata"] == {"name": "llama-train", "labels": {JOB_NAME_LABEL: "llama_train"}}
    assert tt_of(j)["args"][0] == "/astraeus/slurm/llama-train.sbatch"
    assert [n for n in j.notes if "the run is named llama-train" in n and "SLURM_JOB_NAME is llama_train" in n]
    again = j.renamed("llama-train-2")
    assert again.spec["metadata"]["name"] == "llama-train-2"
    assert again.spec["metadata"]["labels"] == {JOB_NAME_LABEL: "llama_train"}
    assert again.spec["spec"] == j.spec["spec"]
    plain = job(["-J", "train", "x.sh"], IMG).renamed("train-2")
    assert plain.spec["metadata"]["labels"] == {JOB_NAME_LABEL: "train"}


def test_partitions_with_underscores_are_pools():
    j = job(["--partition=gpu_large,GPU_Small", "x.sh"], IMG)
    assert tt_of(j)["requested_resources"]["node_selection"]["pools"] == ["gpu-large", "gpu-small"]
    assert tt_of(j)["env"]["SLURM_JOB_PARTITION"] == "gpu-large,gpu-small"
    assert [n for n in j.notes if "pools gpu-large, gpu-small" in n]


def test_a_workspace_default_image_lets_a_script_name_none():
    script = "#!/bin/bash\n#SBATCH --gres=gpu:1\necho\n"
    with pytest.raises(SbatchError, match="default_image"):
        job(["x.sh"], script)
    j = build_job(parse_command_line(["x.sh"]), script, "x.sh", default_image=True)
    assert "image" not in tt_of(j)


def test_wait_and_parsable_are_taken_on_the_command_line():
    cmd = parse_command_line(["-W", "--parsable", "x.sh"])
    assert cmd.options.values["wait"] is True and cmd.options.values["parsable"] is True and cmd.script == "x.sh"
