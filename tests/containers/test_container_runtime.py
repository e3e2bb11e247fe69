"""The container runtime on one machine (ContainerRuntime, runc, a real local registry): what a worker sees in
its container, what it cannot see, its stop reason, its exit status, and that nothing is left after it ends.

The image is the busybox test image (tests/oci.py) pulled over HTTP from the session's local `docker-registry`,
listed as insecure."""

from __future__ import annotations

import json
import os
import subprocess
import threading

import pytest

from astraeus.agent.runtime.base import EXITED, RUNNING, START_FAILED
from astraeus.agent.runtime.container import ContainerRuntime
from tests.agent.conftest import pid_alive, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the container runtime needs root")


@pytest.fixture
def crt(tmp_path, registry):
    """A container runtime with its own state dir and image cache, the session's registry listed insecure."""
    r = ContainerRuntime(str(tmp_path / "state"), stop_grace=2, insecure_registries=[registry.host],
                         image_cache_dir=str(tmp_path / "images"))
    yield r
    for st in r.list():
        if not st.final:
            r.stop(st.worker, st.attempt, grace=0)


@pytest.fixture
def box(tmp_path, busybox_image):
    n = [0]

    def make(script: str, **kw) -> dict:
        n[0] += 1
        a = {"worker": kw.pop("worker", f"team.job-{n[0]}"), "attempt": kw.pop("attempt", 1), "run": "job",
             "desired": "Running", "image": kw.pop("image", busybox_image), "command": "sh", "args": ["-c", script],
             "env": {"ASTRAEUS_JOB_NAME": "team.job", **kw.pop("env", {})}, "gpu_indices": kw.pop("gpus", []),
             "workspace_number": kw.pop("workspace_number", 7), "mounts": kw.pop("mounts", []),
             "configs": kw.pop("configs", [])}
        a.update(kw)
        return a

    return make


def run_to_end(rt, a, timeout: float = 20.0):
    rt.start(a)
    st = wait_for(lambda: (s := rt.status(a["worker"], a["attempt"])).final and s, timeout=timeout)
    return st, "\n".join(line.text for line in rt.logs(a["worker"], a["attempt"]))


def start_fails(rt, a, words: str):
    """The attempt ends StartFailed with `words` in its reason: at once, or after the image's pull (start()
    returns while an image is being pulled)."""
    from astraeus.agent.runtime.base import StartFailed

    try:
        rt.start(a)
    except StartFailed as e:
        assert words in str(e), str(e)
    st = wait_for(lambda: (s := rt.status(a["worker"], a["attempt"])).final and s, timeout=30)
    assert st.state == START_FAILED and words in st.message, st.message
    return st


def test_the_worker_runs_in_its_image_as_the_workspaces_user(crt, box):
    st, out = run_to_end(crt, box("cat /etc/astraeus-test-image; id -u; id -g; pwd; echo PATH=$PATH; "
                                  "echo HOME=$HOME; echo pid=$$; cat /proc/self/status | grep CapEff; exit 3"))
    assert st.state == EXITED and st.exit_code == 3 and st.signal is None
    assert "busybox test image" in out  # a file that exists only in the image
    lines = out.splitlines()
    assert "200007" in lines  # ASTRAEUS_WORKER_UID_BASE + the workspace's number, never root
    assert "/work" in lines  # the image's WorkingDir
    assert "PATH=/opt/astraeus/bin:/bin:/usr/bin" in lines  # the image's Env, after Astraeus' srun and scontrol
    assert "pid=2" in lines  # its own PID namespace: PID 1 is the reaper, the command PID 2
    assert any(ln.startswith("CapEff:") and ln.split()[1] == "0000000000000000" for ln in lines)
    assert st.environment == f"container {box('')['image']}"


def test_a_file_written_outside_drives_is_gone_in_the_next_attempt(crt, box):
    a1 = box("echo left > /tmp/left; echo mine > /work/mine; ls /tmp /work", worker="team.job-x", attempt=1)
    st, out = run_to_end(crt, a1)
    assert st.exit_code == 0 and "left" in out and "mine" in out
    a2 = box("ls /tmp /work; cat /tmp/left || echo no-left", worker="team.job-x", attempt=2)
    st, out = run_to_end(crt, a2)
    assert st.exit_code == 0 and "no-left" in out and "mine" not in out
    assert os.listdir(crt.containers_dir) == []  # each attempt's layer was discarded when it ended


def test_drives_and_configs_are_at_their_mount_paths(crt, box, tmp_path):
    rw, ro = tmp_path / "rw", tmp_path / "ro"
    rw.mkdir()
    ro.mkdir()
    (ro / "model.txt").write_text("weights")
    mounts = [{"host_path": str(rw), "mount_path": "/ckpt", "read_only": False, "granted_root": str(tmp_path)},
              {"host_path": str(ro), "mount_path": "/models", "read_only": True, "granted_root": str(tmp_path)}]
    configs = [{"mount_path": "/etc/app/config.yaml", "value": "lr: 0.1\n"}]
    st, out = run_to_end(crt, box("echo saved > /ckpt/step.txt; cat /models/model.txt; echo; "
                                  "cat /etc/app/config.yaml; echo x > /models/w 2>&1 || echo ro-refused; "
                                  "echo x > /etc/app/config.yaml || echo config-ro", mounts=mounts, configs=configs))
    assert st.exit_code == 0, out
    assert (rw / "step.txt").read_text() == "saved\n"
    assert "weights" in out and "lr: 0.1" in out and "ro-refused" in out and "config-ro" in out
    assert not (ro / "w").exists()


def test_a_drive_through_a_symlink_out_of_its_granted_folder_is_refused(crt, box, tmp_path):
    granted = tmp_path / "granted"
    granted.mkdir()
    (granted / "escape").symlink_to("/etc")
    mounts = [{"host_path": str(granted / "escape"), "mount_path": "/data", "read_only": False,
               "granted_root": str(granted)}]
    start_fails(crt, box("ls /data", mounts=mounts), "symlinks are refused")


def test_the_worker_cannot_see_the_host_the_agent_or_another_worker(crt, box, tmp_path):
    # what a hostile worker would look for: the agent's state dir and credential, the control plane's database
    (tmp_path / "state" / "credential").write_text("secret-machine-credential")
    db = tmp_path / "astraeus.db"
    db.write_text("the control plane's database")
    other = box("echo other-secret > /tmp/other-secret; echo up; while true; do sleep 0.1; done",
                worker="other.job-1", workspace_number=8)
    crt.start(other)
    wait_for(lambda: "up" in [ln.text for ln in crt.logs("other.job-1", 1)])
    other_pid = crt.status("other.job-1", 1).pid
    probe = (f"cat {tmp_path}/state/credential || echo no-credential; cat {db} || echo no-db; "
             f"ls {crt.state_dir} || echo no-state; cat /tmp/other-secret || echo no-other-file; "
             "ls /proc | grep -E '^[0-9]+$' | sort -n | tr '\\n' ' '; echo; "
             f"kill -0 {other_pid} || echo no-other-process; ls /dev | tr '\\n' ' '")
    st, out = run_to_end(crt, box(probe))
    assert st.exit_code == 0, out
    for word in ("no-credential", "no-db", "no-state", "no-other-file", "no-other-process"):
        assert word in out, out
    assert "secret-machine-credential" not in out and "the control plane's database" not in out
    assert "other-secret\n" not in out + "\n"  # the other worker's file's content (its name is in errors)
    pids = next(ln for ln in out.splitlines() if ln.strip() and ln.strip()[0].isdigit()).split()
    assert pids[:2] == ["1", "2"] and len(pids) <= 6  # its own namespace: the reaper, itself, its commands
    crt.stop("other.job-1", 1, grace=0)


def test_only_the_assigned_gpus_show(crt, box):
    st, out = run_to_end(crt, box("echo NV=$NVIDIA_VISIBLE_DEVICES CUDA=$CUDA_VISIBLE_DEVICES; ls /dev", gpus=[2, 5]))
    assert st.exit_code == 0
    assert "NV=2,5 CUDA=0,1" in out  # the machine's GPUs 2 and 5, numbered 0 and 1 inside
    assert "nvidia" not in out.split("CUDA=0,1", 1)[1]  # no other GPU's device node (none here: simulated)


def test_the_stop_reason_is_in_the_file_before_sigterm(crt, box):
    # "ready" once the file was looked at: the stop comes after that look, never between "ready" and it
    a = box("trap 'cat $ASTRAEUS_STOP_REASON_FILE; exit 7' TERM; "
            "cat $ASTRAEUS_STOP_REASON_FILE 2>/dev/null || echo no-reason-yet; echo ready; while true; do sleep 0.1; done")
    crt.start(a)
    wait_for(lambda: "ready" in [ln.text for ln in crt.logs(a["worker"], 1)])
    st = crt.stop(a["worker"], 1, grace=5, reason="Preempted by team/urgent-eval")
    assert st.state == EXITED and st.exit_code == 7 and not st.extra["killed"]
    out = [ln.text for ln in crt.logs(a["worker"], 1)]
    assert "no-reason-yet" in out
    reason = json.loads(next(t for t in out if t.startswith("{")))
    assert reason["reason"] == "Preempted by team/urgent-eval" and 4 <= reason["grace_seconds"] <= 5


def test_sigterm_to_the_main_process_and_sigkill_at_the_grace_leaves_nothing(crt, box):
    # the main process ignores SIGTERM and starts a child that does too: both are killed at the grace
    a = box("trap '' TERM; (trap '' TERM; while true; do sleep 0.1; done) & echo ready; while true; do sleep 0.1; done")
    crt.start(a)
    wait_for(lambda: "ready" in [ln.text for ln in crt.logs(a["worker"], 1)])
    pid = crt.status(a["worker"], 1).pid
    st = crt.stop(a["worker"], 1, grace=1)
    assert st.state == EXITED and st.signal == 9 and st.extra["killed"]
    assert not pid_alive(pid)
    assert os.listdir(crt.containers_dir) == []
    listed = subprocess.run(["runc", "--root", crt.runc_root, "list", "-q"], capture_output=True, text=True).stdout
    assert listed.split() == []
    assert crt._marked_pids(a["worker"], 1) == []


def test_a_signal_that_ends_the_command_is_reported_as_a_signal(crt, box):
    st, _ = run_to_end(crt, box("kill -TERM $$; sleep 5"))
    assert st.state == EXITED and st.signal == 15 and st.exit_code is None


def test_a_command_not_in_the_image_fails_to_start_clearly(crt, box):
    a = box("")
    a.update(command="trian.py", args=[])
    start_fails(crt, a, "no such command: trian.py")
    assert os.listdir(crt.containers_dir) == []


def test_an_agent_restart_adopts_the_running_container(crt, box, tmp_path):
    a = box("trap 'echo bye; exit 0' TERM; echo ready; while true; do sleep 0.1; done")
    crt.start(a)
    wait_for(lambda: "ready" in [ln.text for ln in crt.logs(a["worker"], 1)])
    pid = crt.status(a["worker"], 1).pid
    again = ContainerRuntime(crt.state_dir, stop_grace=2, insecure_registries=crt.insecure,
                             image_cache_dir=crt.image_cache_dir)
    adopted = {s.key: s for s in again.adopt()}
    assert adopted[(a["worker"], 1)].state == RUNNING and adopted[(a["worker"], 1)].pid == pid
    st = again.stop(a["worker"], 1, grace=5)
    assert st.exit_code == 0 and "bye" in [ln.text for ln in again.logs(a["worker"], 1)]


def test_pull_failures_are_clear_start_failures(crt, box, registry):
    cases = {
        f"{registry.host}/no/such-image:1": "not found",
        "127.0.0.1:1/team/eval:1": "unreachable",
    }
    for i, (image, words) in enumerate(cases.items()):
        st = start_fails(crt, box("true", image=image, worker=f"team.bad-{i}"), words)
        assert image in st.message
        # the worker's cgroups, made before the pull, are removed with its failure (none left on the machine)
        with open(os.path.join(crt.dir(f"team.bad-{i}", 1), "spec.json")) as f:
            cg = json.load(f).get("cgroups") or {}
        made = [d for d in [cg.get("v2"), *(cg.get("v1") or {}).values()] if d]
        assert made and not [d for d in made if os.path.exists(d)]
    a = box("true", image="Not An Image", worker="team.bad-x")
    with pytest.raises(Exception, match="is not an image reference"):
        crt.start(a)


def test_a_registry_that_wants_a_password(crt, box, auth_registry, busybox_layout):
    from tests.oci import push

    image = push(busybox_layout, auth_registry, "team/private:1")
    rt = ContainerRuntime(crt.state_dir + "-auth", stop_grace=2, insecure_registries=[auth_registry.host],
                          image_cache_dir=crt.image_cache_dir + "-auth")
    bad = box("true", image=image, worker="team.auth-1")
    bad["registry_auth"] = {"registry": auth_registry.host, "username": auth_registry.username, "password": "wrong"}
    start_fails(rt, bad, "unauthorized: the workspace's credentials for")
    start_fails(rt, box("true", image=image, worker="team.auth-2"), "no credentials for")
    good = box("cat /etc/astraeus-test-image", image=image, worker="team.auth-3")
    good["registry_auth"] = {"registry": auth_registry.host, "username": auth_registry.username,
                             "password": auth_registry.password}
    st, out = run_to_end(rt, good)
    assert st.exit_code == 0 and "busybox test image" in out
    # the password is nowhere on the machine's disk under the agent's state or the cache
    for root in (rt.state_dir, rt.image_cache_dir):
        for dirpath, _, files in os.walk(root):
            for f in files:
                try:
                    with open(os.path.join(dirpath, f), "rb") as fh:
                        assert auth_registry.password.encode() not in fh.read(), os.path.join(dirpath, f)
                except OSError:
                    pass


def test_two_workers_starting_from_one_uncached_image_pull_it_once(crt, box, registry, busybox_layout):
    from tests.oci import layer_digests, push

    image = push(busybox_layout, registry, "team/once:1")
    layer = layer_digests(busybox_layout)[0]
    before = registry.blob_gets(layer)
    a, b = box("echo one", image=image, worker="team.once-a"), box("echo two", image=image, worker="team.once-b")
    errors: list[Exception] = []

    def start(x):
        try:
            crt.start(x)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=start, args=(x,)) for x in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for x in (a, b):
        st = wait_for(lambda x=x: (s := crt.status(x["worker"], 1)).final and s, timeout=20)
        assert st.exit_code == 0
    assert registry.blob_gets(layer) - before == 1


def test_real_gpu_nodes_only_the_assigned_ones(tmp_path, registry, box):
    """Stand-in NVIDIA device nodes (major 195, no driver here): the worker gets nodes for its GPUs and the
    control node only; the device cgroup lets it open those (ENXIO: no driver behind them) and nothing else."""
    import stat

    dev = tmp_path / "dev"
    dev.mkdir()
    for n in range(4):
        os.mknod(dev / f"nvidia{n}", 0o666 | stat.S_IFCHR, os.makedev(195, n))
    os.mknod(dev / "nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(195, 255))
    rt = ContainerRuntime(str(tmp_path / "state"), stop_grace=1, insecure_registries=[registry.host],
                          image_cache_dir=str(tmp_path / "images"), device_dir=str(dev))
    st, out = run_to_end(rt, box("ls /dev | grep nvidia | tr '\\n' ' '; echo; cat /dev/nvidia2; "
                                 "mknod /dev/x c 195 0 || echo no-mknod", gpus=[1, 2]))
    listed = out.splitlines()[0].split()
    assert sorted(listed) == ["nvidia1", "nvidia2", "nvidiactl"], out
    assert "'/dev/nvidia2': No such device or address" in out, out  # allowed by the device cgroup; no driver here
    assert "no-mknod" in out  # no capability to make another node


def test_mount_paths_inside_another_drive_are_made_in_the_container_only(crt, box, tmp_path):
    outer, inner = tmp_path / "outer", tmp_path / "inner"
    outer.mkdir()
    inner.mkdir()
    (outer / "kept.txt").write_text("outer file")
    mounts = [{"host_path": str(outer), "mount_path": "/data", "read_only": False, "granted_root": str(tmp_path)},
              {"host_path": str(inner), "mount_path": "/data/sub/ckpt", "read_only": False,
               "granted_root": str(tmp_path)}]
    configs = [{"mount_path": "/data/app/conf.json", "value": "{}"}]
    st, out = run_to_end(crt, box("cat /data/kept.txt; echo; echo w > /data/sub/ckpt/step; cat /data/app/conf.json",
                                  mounts=mounts, configs=configs))
    assert st.exit_code == 0, out
    assert "outer file" in out and "{}" in out
    assert (inner / "step").read_text() == "w\n"
    assert sorted(os.listdir(outer)) == ["kept.txt"]  # no mount point was made in the drive on the host


def test_the_worker_cannot_make_namespaces_or_mounts(crt, box):
    """No capabilities, and a seccomp filter: no new user namespace (which would give it capabilities over
    namespaces of its own), no mount, no setns."""
    st, out = run_to_end(crt, box("unshare -U true && echo userns-made || echo no-userns; "
                                  "unshare -n true && echo netns-made || echo no-netns; "
                                  "mount -t tmpfs none /tmp && echo mounted || echo no-mount"))
    assert st.exit_code == 0, out
    assert "no-userns" in out and "no-netns" in out and "no-mount" in out, out
    assert "made" not in out and "mounted" not in out
