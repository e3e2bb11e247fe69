"""Issue 42, item 5: grants that cannot overlap. Two workspaces (`vision`, `nlp`) share the granted root
/data/astraeus on a real `astraeus up` cluster; vision keeps its weights in a drive there. nlp tries, as a hostile
editor would, to make a drive inside vision's drive folder and one above it (printing `REACHED`/`BLOCKED` per
step): the control plane refuses both without naming vision or its drive. Once vision deletes its drive (its files
stay), the control plane cannot know the folder is vision's: nlp's drive inside it is accepted, and then the agent
refuses to make or mount anything there (the folder is owned by vision's uid), so nlp's worker fails to start with
that reason. Vision's files are untouched throughout, on both runtimes.

The agent's rule on its own (ProcessRuntime, no control plane): a drive whose folder, or a folder on the way to it
below the granted root, belongs to another workspace's uid is refused before anything is made below it; the
workspace's own folders are used as before; with no granted root nothing is made."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from astraeus.agent.runtime.base import START_FAILED, StartFailed
from astraeus.agent.runtime.process import ProcessRuntime

from .conftest import cluster_on, wait_for

pytestmark = pytest.mark.faults

UID_BASE = 200000  # ASTRAEUS_WORKER_UID_BASE's default: a workspace's uid is the base plus its number


# ------------------------------------------------------------------------------------ the agent's rule alone


@pytest.fixture
def rt(tmp_path):
    r = ProcessRuntime(str(tmp_path / "state"), stop_grace=1)
    yield r
    for st in r.list():
        if not st.final:
            r.stop(st.worker, st.attempt, grace=0)


def _assignment(worker: str, number: int, mounts: list[dict]) -> dict:
    return {"worker": worker, "attempt": 1, "run": "grants", "desired": "Running", "image": "python:3.11",
            "command": "python", "args": ["-c", "import os; print(sorted(os.listdir('/d')))"], "env": {},
            "gpu_indices": [], "workspace": worker.partition(".")[0], "workspace_number": number,
            "mounts": mounts, "configs": []}


def _drive(host_path: Path, granted: Path | None, create: bool) -> dict:
    return {"host_path": str(host_path), "mount_path": "/d", "read_only": False, "create": create,
            "granted_root": str(granted) if granted else None}


@pytest.fixture
def vision_folder(tmp_path):
    """<grant>/adrive, a folder of workspace 7 (mode 0700, its weights inside), as its drive left it."""
    granted = tmp_path / "data"
    adrive = granted / "adrive"
    (adrive / "ckpt").mkdir(parents=True)
    (adrive / "weights.bin").write_text("vision's weights")
    for p in (adrive, adrive / "ckpt", adrive / "weights.bin"):
        os.chown(p, UID_BASE + 7, UID_BASE + 7)
    adrive.chmod(0o700)
    return granted, adrive


@pytest.mark.parametrize("where,create", [("ckpt/new", True), ("new/deeper", True), ("ckpt", False), ("ckpt", True),
                                          (".", False)])
def test_the_agent_makes_and_mounts_nothing_in_another_workspaces_folder(rt, vision_folder, where, create):
    granted, adrive = vision_folder
    before = sorted(str(p.relative_to(adrive)) for p in adrive.rglob("*"))
    worker = f"ws-00000000000b.grab-{abs(hash((where, create))) % 10**8}"
    a = _assignment(worker, 8, [_drive(adrive / where, granted, create)])
    with pytest.raises(StartFailed, match=f"{adrive} is a folder of another workspace; a drive may not be in it"):
        rt.start(a)
    assert rt.status(worker, 1).state == START_FAILED
    assert sorted(str(p.relative_to(adrive)) for p in adrive.rglob("*")) == before  # nothing made, nothing handed
    assert (adrive.stat().st_uid, adrive.stat().st_mode & 0o777) == (UID_BASE + 7, 0o700)


def test_the_workspaces_own_folders_are_used_as_before(rt, vision_folder):
    granted, adrive = vision_folder
    worker = "ws-00000000000a.own-0"
    rt.start(_assignment(worker, 7, [_drive(adrive / "ckpt" / "new", granted, True)]))
    st = wait_for(lambda: (s := rt.status(worker, 1)) is not None and s.final and s, timeout=30, what=worker)
    assert st.exit_code == 0, [ln.text for ln in rt.logs(worker, 1)]
    new = adrive / "ckpt" / "new"
    assert new.is_dir() and new.stat().st_uid == UID_BASE + 7


def test_without_a_granted_root_nothing_is_made(rt, tmp_path):
    target = tmp_path / "nowhere" / "d"
    worker = "ws-00000000000b.nogrant-0"
    with pytest.raises(StartFailed, match="no host path granted to the workspace holds it"):
        rt.start(_assignment(worker, 8, [_drive(target, None, True)]))
    assert not (tmp_path / "nowhere").exists()


# ------------------------------------------------------------------------------------ a hostile tenant, end to end

WRITER = r'''
import os
os.makedirs("/w/ckpt", exist_ok=True)
with open("/w/weights.bin", "w") as f:
    f.write("vision's weights")
with open("/w/ckpt/step", "w") as f:
    f.write("7")
print("saved", flush=True)
'''

READER = r'''
import os
print("LISTED", sorted(os.listdir("/grab")), flush=True)
'''


def _run(name: str, code: str, drive: str, mount: str, image: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": image, "command": "python", "args": ["-c", code], "restart_policy": "Never",
        "datavolume_refs": [{"name": drive, "mount_path": mount, "mode": "ReadWrite"}],
        "requested_resources": {"cpu_cores": 1, "memory_bytes": 1 << 28, "gpu_requests": {"count": 1}}}}}


def _drive_body(name: str, path: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"sources": [
        {"node": "gpu-01", "path": path, "mount_path": "/grab", "mode": "ReadWrite"}],
        "transport": "Auto", "permissions": {"create": True}}}


@pytest.fixture
def cluster(runtime):
    with cluster_on(runtime, "astraeus-grants-") as c:
        yield c


def _tree(root: Path) -> dict[str, tuple[int, int, bytes | None]]:
    """Every entry under root: (owner, mode, content of a file)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (st.st_uid, st.st_mode, p.read_bytes() if p.is_file() else None)
    return out


def test_a_hostile_tenant_cannot_make_a_drive_in_or_above_anothers(cluster):
    tag = f"astraeus-grants-{uuid.uuid4().hex[:8]}"
    base = Path("/data/astraeus") / tag
    adrive = base / "adrive"
    base.mkdir(parents=True)
    steps: list[str] = []

    def step(what: str, reached: bool, said: str) -> None:
        line = f"{'REACHED' if reached else 'BLOCKED'} {what}: {said}"
        print(line)
        steps.append(line)

    try:
        with cluster.client() as vis:
            r = vis.post("/drives", json=_drive_body("weights", str(adrive)))
            assert r.status_code == 201, r.text
            assert vis.post("/runs", json=_run("save", WRITER, "weights", "/w", cluster.image)).status_code == 201
            wait_for(lambda: vis.get("/workers/save-0").json()["state"] == "Succeeded", timeout=60,
                     what="vision's weights saved")
        vision_files = _tree(adrive)
        assert vision_files["weights.bin"][2] == b"vision's weights"
        with cluster.admin() as adm:
            r = adm.post("/workspaces", json={"name": "nlp", "clusters": {"main": {"host_paths": ["/data/astraeus"]}}})
            assert r.status_code == 201, r.text
            nlp_token = adm.post("/tokens", json={"kind": "user", "workspace": "nlp", "role": "editor"}).json()["token"]
        with cluster.client(nlp_token) as nlp:
            nlp.base_url = cluster.api.replace("/w/vision", "/w/nlp")
            # while vision's drive exists, the control plane refuses a drive inside it, at it and above it
            for what, path in (("drive_inside", adrive / "ckpt"), ("drive_at", adrive), ("drive_above", base)):
                r = nlp.post("/drives", json=_drive_body(what.replace("_", "-"), str(path)))
                step(what, r.status_code == 201, f"{r.status_code} {r.json().get('message')}")
                assert r.status_code == 409 and "vision" not in r.text and "weights" not in r.text, r.text
            assert nlp.get("/drives").json()["items"] == []

            # vision deletes its drive (its files stay): the folders are still vision's, and the agent says so
            with cluster.client() as vis:
                assert vis.delete("/drives/weights").status_code == 200
            for what, path in (("read_leftover", adrive / "ckpt"), ("plant_in_leftover", adrive / "planted")):
                name = what.replace("_", "-")
                r = nlp.post("/drives", json=_drive_body(name, str(path)))
                assert r.status_code == 201, r.text
                assert nlp.post("/runs", json=_run(name, READER, name, "/grab", cluster.image)).status_code == 201
                w = wait_for(lambda n=name: (w := nlp.get(f"/workers/{n}-0").json())["state"] in (
                    "Succeeded", "Failed") and w, timeout=60, what=f"{name} ended")
                logs = nlp.get(f"/workers/{name}-0/logs").text
                step(what, "LISTED" in logs or w["state"] == "Succeeded", w["reason"] or logs)
                assert w["state"] == "Failed", (w, logs)
                assert f"{adrive} is a folder of another workspace; a drive may not be in it" in w["reason"], w
        reached = [s for s in steps if s.startswith("REACHED")]
        assert not reached, "\n".join(steps)
        assert len(steps) == 5
        assert _tree(adrive) == vision_files  # nothing made, read, handed over or changed in vision's folder
    finally:
        shutil.rmtree(base, ignore_errors=True)
