"""Real batch scripts run as written (issue 44): tests/slurm_corpus holds GPU batch scripts whose `#SBATCH` headers
are as public ML repositories and university cluster pages write them (each names its source in a comment). Every
one is parsed by `astra slurm sbatch`'s own parser, with the site's default image standing in for the image none of
them names; at least 90 % must be accepted as written and each of the rest refused with what to change."""

import re
from pathlib import Path

import pytest

from astraeus.cli.slurm import SbatchError, build_job, parse_command_line
from astraeus.spec import RunCreate

CORPUS = Path(__file__).resolve().parent.parent / "slurm_corpus"
SCRIPTS = sorted(p for p in CORPUS.iterdir() if p.is_file())
SITE_IMAGE = "nvcr.io/nvidia/pytorch:24.08-py3"  # what the workspace's default_image fills in at submit
NEXT_STEP = re.compile(r": (give|add|use|write|set|name|ask)\b")


def parse(path: Path):
    return build_job(parse_command_line([str(path)]), path.read_text(), path.name, default_image=True)


def outcome(path: Path) -> str | None:
    """None when accepted, else the refusal."""
    try:
        parse(path)
    except SbatchError as e:
        return str(e)
    return None


def test_the_corpus_is_large_and_names_its_sources():
    assert len(SCRIPTS) >= 25
    for p in SCRIPTS:
        text = p.read_text()
        assert text.startswith("#!/bin/bash\n# The #SBATCH header as "), p.name
        assert "#SBATCH" in text and "--container-image" not in text, p.name


def test_most_scripts_are_accepted_as_written_and_the_rest_say_what_to_change():
    refused = {p.name: m for p in SCRIPTS if (m := outcome(p)) is not None}
    accepted = len(SCRIPTS) - len(refused)
    assert accepted / len(SCRIPTS) >= 0.9, refused
    for name, message in refused.items():
        assert message.startswith("sbatch: "), (name, message)
        assert NEXT_STEP.search(message), (name, message)
        assert f"of {name}" in message, (name, message)  # the #SBATCH line it is about


ACCEPTED = [p for p in SCRIPTS if outcome(p) is None]  # the refused ones: the test above


@pytest.mark.parametrize("path", ACCEPTED, ids=lambda p: p.name)
def test_an_accepted_script_is_a_run_the_api_takes(path):
    job = parse(path)
    for body in job.bodies():
        body["spec"]["task_template"].setdefault("image", SITE_IMAGE)
        run = RunCreate.model_validate(body)  # the API's own body model: every field as the server reads it
        assert run.spec.task_template.command == "bash"
    assert all(n.startswith("sbatch: note: ") and "\n" not in n for n in job.notes)


def test_what_the_corpus_asks_is_kept():
    titan = parse(CORPUS / "torchtitan_multinode_trainer.slurm")
    assert titan.name == "torchtitan-multi-node" and titan.job_name == "torchtitan_multi_node"
    rr = titan.spec["spec"]["task_template"]["requested_resources"]
    assert rr["machines"] == 4 and rr["gpu_requests"] == {"count": 32, "min_per_machine": 8}
    assert rr["cpu_cores"] == 4 * 96
    bloom = parse(CORPUS / "bigscience_tr11_176b.slurm")
    sel = bloom.spec["spec"]["task_template"]["requested_resources"]["node_selection"]
    assert sel == {"mode": "Labels", "labels": {"a100": "true"}, "pools": ["gpu-p5"], "reservation": "hug"}
    assert bloom.spec["spec"]["task_template"]["time_limit_seconds"] == 100 * 3600
    r1 = parse(CORPUS / "hf_open_r1_train.slurm")  # `--err` is Slurm's abbreviation of --error
    assert any("--output and --error ignored (./logs/open-r1-open-r1.out, ./logs/open-r1-open-r1.err)" in n
               for n in r1.notes)
    visu = parse(CORPUS / "hpc_array_sweep.sh")
    assert visu.array is not None and len(visu.bodies()) == 10


# --- through the control plane: the site's default image, and Slurm's job environment in every worker ----------

REG = {"gpus": 8, "cpu_cores": 64, "memory_bytes": 1 << 40, "stop_grace_seconds": 1}
LLAMA = ("#!/bin/bash\n#SBATCH --job-name=llama_train\n#SBATCH --gres=gpu:2\n#SBATCH --ntasks-per-node=2\n"
         "#SBATCH --cpus-per-task=4\n#SBATCH --account=proj\necho $SLURM_JOB_ID\n")


def _admin(app) -> dict:
    return {"Authorization": f"Bearer {app.boot['admin_token']}"}


def _set_default_image(app, image, status: int = 200) -> dict:
    r = app.client.patch("/api/v1/o/acme/workspaces/vision", headers=_admin(app),
                         json={"clusters": {"main": {"default_image": image}}})
    assert r.status_code == status, r.text
    return r.json()


def _envs(app, machine: str) -> dict[str, dict]:
    r = app.client.post("/api/v1/agent/register", headers={"Authorization": f"Bearer {app.boot['machine_token']}"},
                        json={"name": machine, **REG})
    assert r.status_code == 200, r.text
    cred = r.json()["credential"]

    def running() -> dict[str, dict]:
        got = app.client.get("/api/v1/agent/assignments", params={"machine": machine},
                             headers={"Authorization": f"Bearer {cred}"}).json()["assignments"]
        return {a["name"]: a["env"] for a in got if a["desired"] == "Running"}
    return running


def test_a_script_naming_no_image_runs_with_the_workspace_default(app):
    body = build_job(parse_command_line(["llama.sh"]), LLAMA, "llama.sh", default_image=True).spec
    r = app.client.post(app.api + "/runs", json=body, headers=app.h())
    assert r.status_code == 422, r.text  # no default yet: what to do next
    assert "spec.task_template.image: the run names no image and workspace vision has no default image on " \
           "cluster main" in r.text and "clusters.main.default_image" in r.text
    bad = _set_default_image(app, "Bad Image", 422)
    assert "clusters.main.default_image: image 'Bad Image' is not an image reference" in bad["message"]
    ws = _set_default_image(app, SITE_IMAGE)
    assert ws["clusters"]["main"]["default_image"] == SITE_IMAGE
    assert app.client.get(app.api, headers=app.h()).json()["clusters"][0]["default_image"] == SITE_IMAGE
    r = app.client.post(app.api + "/runs", json=body, headers=app.h())
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["task_template"]["image"] == SITE_IMAGE
    assert r.json()["metadata"]["name"] == "llama-train"
    # a run that names its image keeps it; null again: no default
    assert _set_default_image(app, None)["clusters"]["main"]["default_image"] is None


def test_every_worker_has_slurms_job_environment(app):
    from tests.conftest import wait_for

    _set_default_image(app, SITE_IMAGE)
    job = build_job(parse_command_line(["llama.sh"]), LLAMA, "llama.sh", default_image=True)
    r = app.client.post(app.api + "/runs", json=job.spec, headers=app.h())
    assert r.status_code == 201, r.text
    visu = parse(CORPUS / "hpc_array_sweep.sh")
    for body in visu.bodies()[:2]:
        r = app.client.post(app.api + "/runs", json=body, headers=app.h())
        assert r.status_code == 201, r.text
    running = _envs(app, "gpu-01")
    wait_for(lambda: {"llama-train-0", "visu_0-0", "visu_1-0"} <= set(running()), what="the runs placed")
    envs = running()
    e = envs["llama-train-0"]
    assert e["SLURM_JOB_NAME"] == "llama_train"  # the script's name, while the run's is a DNS label
    assert e["SLURM_JOB_ID"].isdigit() and e["SLURM_JOB_ID"] != envs["visu_0-0"]["SLURM_JOB_ID"]
    assert (e["SLURM_NNODES"], e["SLURM_NODELIST"], e["SLURM_NODEID"], e["SLURM_PROCID"], e["SLURM_LOCALID"]) == \
           ("1", "gpu-01", "0", "0", "0")
    assert (e["SLURM_NTASKS"], e["SLURM_NTASKS_PER_NODE"], e["SLURM_CPUS_PER_TASK"]) == ("2", "2", "4")
    assert e["SLURM_GPUS_ON_NODE"] == "2"
    for i in (0, 1):  # an array task's SLURM_JOB_NAME is the array's, as Slurm gives it
        v = envs[f"visu_{i}-0"]
        assert v["SLURM_JOB_NAME"] == "visu" and v["SLURM_ARRAY_TASK_ID"] == str(i)
        assert v["SLURM_ARRAY_JOB_ID"] == "visu" and v["SLURM_NTASKS"] == "1"


def test_a_resubmitted_script_gets_a_new_run_name(app):
    """What `astra slurm sbatch` does on 409 ALREADY_EXISTS: the same job as NAME-2 (Slurm allows many jobs of one
    name), its SLURM_JOB_NAME still the script's."""
    _set_default_image(app, SITE_IMAGE)
    job = build_job(parse_command_line(["llama.sh"]), LLAMA, "llama.sh", default_image=True)
    assert app.client.post(app.api + "/runs", json=job.spec, headers=app.h()).status_code == 201
    r = app.client.post(app.api + "/runs", json=job.spec, headers=app.h())
    assert r.status_code == 409 and r.json()["code"] == "ALREADY_EXISTS", r.text
    r = app.client.post(app.api + "/runs", json=job.renamed("llama-train-2").spec, headers=app.h())
    assert r.status_code == 201, r.text
    assert r.json()["metadata"]["labels"] == {"slurm.astraeus.io/job-name": "llama_train"}


def test_astra_sbatch_runs_a_script_as_written(cluster, tmp_path):
    """`astra slurm sbatch` against a real local cluster: no image in the script (the workspace's default), a job
    name that is no run name, a resubmission, and the worker's Slurm environment in its output."""
    import subprocess
    import sys

    astra = [str(Path(sys.executable).parent / "astra"), "slurm", "sbatch"]
    script = ("#!/bin/bash\n# The #SBATCH header as a user writes it.\n#SBATCH --job-name=llama_train\n"
              "#SBATCH --gres=gpu:1\n#SBATCH --ntasks-per-node=1\n#SBATCH --account=proj\n#SBATCH --tim=10\n"
              'echo "$SLURM_JOB_NAME $SLURM_NNODES $SLURM_NODELIST $SLURM_PROCID $SLURM_NTASKS ${SLURM_JOB_ID//[0-9]/}"\n')
    (tmp_path / "llama.sh").write_text(script)

    def sbatch(*args):
        return subprocess.run([*astra, *args], env=cluster.env, capture_output=True, text=True, timeout=60,
                              cwd=tmp_path)

    r = sbatch("llama.sh")
    assert r.returncode == 1 and "no container image" in r.stderr and "default_image" in r.stderr, r.stderr
    with cluster.admin() as a:
        ws = cluster.api.rsplit("/w/", 1)[1].split("/")[0]
        assert a.patch(f"/workspaces/{ws}", json={"clusters": {"main": {"default_image": SITE_IMAGE}}}).status_code == 200
    r = sbatch("llama.sh")
    assert r.returncode == 0 and r.stdout == "Submitted batch job llama-train\n", r.stderr
    assert "sbatch: note: --account=proj: Astraeus has no accounts" in r.stderr
    assert "SLURM_JOB_NAME is llama_train" in r.stderr
    r = sbatch("llama.sh")
    assert r.returncode == 0 and r.stdout == "Submitted batch job llama-train-2\n", r.stderr
    run = cluster.run("llama-train-2")
    assert run["spec"]["task_template"]["image"] == SITE_IMAGE
    assert run["spec"]["task_template"]["time_limit_seconds"] == 600  # `--tim` is Slurm's abbreviation of --time
    logs = [astra[0], "astraeus", "logs", "llama-train-0"]
    cluster.wait_for(lambda: subprocess.run(logs, env=cluster.env, capture_output=True, text=True, timeout=60).stdout
                     == "llama_train 1 gpu-01 0 1 \n", timeout=60, interval=0.5, what="the script's line")
