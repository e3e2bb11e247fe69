"""Issue 13, items 1 and 4: a hostile tenant on a shared machine. Two workspaces (`vision`, `nlp`) share gpu-01 of
a real `astraeus up` cluster; vision runs a long worker with a secret env value, a config and a drive; nlp submits a
worker whose command tries every attack, one step each, printing `REACHED <what>` or `BLOCKED <what>`, with
configs at /etc/…, /opt/…/… and inside the agent's state dir. Every step must be BLOCKED, nothing may appear on
the host, and vision's worker runs on untouched (Running, same pid, its log growing, and it still stops).

The guarantees are a checklist: ATTACKS holds one function per attack (its source runs inside the hostile
worker), GUARANTEES the host-side checks. The container runtime (issue 14) gives the same guarantees: the test
runs on both (`runtime`: ids process/container; in a container, the host paths the attacks aim at are the
host's, as the test found them, so each attack means the same).

Issue 42, items 6 and 7: the process runtime at container parity. nlp's worker cannot attach vision's System V shared
memory (each worker has its own IPC namespace), make a user or network namespace (unshare, clone), add a key, open
/dev/fuse or /dev/net/tun (the containers' seccomp filter and /dev), nor read vision's ReadOnly dataset by its host
path (the process runtime's view shows the host's system folders, not its data folders)."""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import signal
import textwrap
import uuid
from pathlib import Path

import pytest

import astraeus.agent.runtime.shim as shim_module

from .conftest import pid_alive, wait_for, worker_procs

pytestmark = pytest.mark.faults


# --------------------------------------------------------------------------- the checklist: one function per attack
# Each runs inside nlp's worker with T (the targets, as the test found them on the host). It returns what it
# reached (truthy: REACHED) or raises / returns something empty (BLOCKED).

def attack_is_root(T):
    return os.getuid() == 0 or os.geteuid() == 0


def attack_has_capabilities(T):
    caps = {ln.split(":")[0]: int(ln.split()[1], 16) for ln in open("/proc/self/status") if ln.startswith("Cap")}
    nnp = next(ln.split()[1] for ln in open("/proc/self/status") if ln.startswith("NoNewPrivs"))
    return caps["CapEff"] or caps["CapPrm"] or caps["CapBnd"] or caps["CapAmb"] or nnp != "1"


def attack_agent_environ(T):
    return open(f"/proc/{T['agent_pid']}/environ", "rb").read()


def attack_any_host_process(T):
    # the host's processes (the agent, the control plane, vision's worker) are not visible at all
    return [p for p in os.listdir("/proc") if p.isdigit() and int(p) > 64]


def attack_home_env_file(T):
    return open(os.path.join(T["home"], "env")).read()


def attack_database(T):
    return open(os.path.join(T["home"], "astraeus.db"), "rb").read(4096)


def attack_agent_state_dir(T):
    # anything the agent keeps there (specs, logs, configs, its fifo), past the worker's own mount points (its
    # working folder and its configs' paths, made in its own view)
    own = os.getcwd()
    found = []
    for root, _dirs, files in os.walk(T["state_dir"]):
        if root == own or root.startswith(own + "/"):
            continue
        found += [os.path.join(root, f) for f in files if f != "stop.json"]
    return found


def attack_vision_spec_and_config(T):
    d = os.path.join(T["state_dir"], "workers", T["vision_dir"])
    return open(os.path.join(d, "spec.json")).read() or open(os.path.join(d, "configs", "0")).read()


def attack_vision_environ(T):
    return open(f"/proc/{T['vision_pid']}/environ", "rb").read()


def attack_vision_root(T):
    return open(f"/proc/{T['vision_pid']}/root/etc/vision/conf.yaml").read()


def attack_vision_drive_host_folder(T):
    return os.listdir(T["vision_drive"]) or open(os.path.join(T["vision_drive"], "progress")).read()


def attack_write_etc(T):
    with open(f"/etc/{T['tag']}-etc", "w") as f:
        f.write("pwned")
    return "wrote /etc"


def attack_write_root(T):
    with open(f"/root/{T['tag']}-root", "w") as f:
        f.write("pwned")
    return "wrote /root"


def attack_kill_vision(T):
    os.kill(T["vision_pid"], signal.SIGKILL)
    return "signalled"


def attack_kill_everything_visible(T):
    hit = []
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) not in (1, os.getpid()):
            try:
                if T["vision_secret"].encode() in open(f"/proc/{p}/environ", "rb").read():
                    os.kill(int(p), signal.SIGKILL)
                    hit.append(p)
            except OSError:
                pass
    return hit


def attack_rewrite_installed_shim(T):
    with open(T["shim"], "a") as f:
        f.write("\n# pwned\n")
    return "appended to the shim"


def attack_write_read_only_drive_by_host_path(T):
    with open(os.path.join(T["ro_drive"], "pwned"), "w") as f:
        f.write("x")
    return "wrote the host folder"


def attack_write_read_only_drive(T):
    with open("/ro/pwned", "w") as f:
        f.write("x")
    return "wrote /ro"


def attack_remount_read_write(T):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(None, b"/", None, 32 | 4096, None) == 0:  # MS_REMOUNT | MS_BIND, without MS_RDONLY
        return "remounted / read-write"
    if libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None) == 0:
        return "mounted a tmpfs"
    return ""


def attack_setuid_root(T):
    os.setuid(0)
    return "setuid(0)"


def attack_config_in_state_dir_reaches_host(T):
    # nlp's config at <state dir>/workers/<vision's folder>/stop.json: the one in the view must not be vision's
    p = os.path.join(T["state_dir"], "workers", T["vision_dir"])
    return [n for n in os.listdir(p) if n != "stop.json"]


def attack_sysv_shm_of_vision(T):
    # vision's worker made a System V shared memory segment with this key and wrote its secret in it
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    shmid = libc.shmget(T["shm_key"], 0, 0)
    if shmid < 0:
        raise OSError(ctypes.get_errno(), "shmget")
    addr = libc.shmat(shmid, None, 0o10000)  # SHM_RDONLY
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "shmat")
    return ctypes.string_at(addr, 80)


def attack_unshare_user_net(T):
    # a user namespace (root in it: capabilities over namespaces of its own) and a network namespace, by unshare()
    # and by clone() with the flags
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    made = [name for name, flags in (("user", 0x10000000), ("net", 0x40000000), ("user+net", 0x50000000))
            if libc.unshare(flags) == 0]
    nr = {"x86_64": 56, "aarch64": 220}[os.uname().machine]
    pid = libc.syscall(nr, 0x10000000 | 0x40000000 | signal.SIGCHLD, 0, 0, 0, 0)  # clone, fork-like
    if pid == 0:
        os._exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
        made.append("clone(CLONE_NEWUSER|CLONE_NEWNET)")
    return made


def attack_add_key(T):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    nr = {"x86_64": 248, "aarch64": 217}[os.uname().machine]
    serial = libc.syscall(nr, b"user", b"astraeus-hostile", b"x", 1, -2)  # KEY_SPEC_PROCESS_KEYRING
    if serial < 0:
        raise OSError(ctypes.get_errno(), "add_key")
    return f"key {serial}"


def attack_dev_fuse(T):
    fd = os.open("/dev/fuse", os.O_RDWR)
    os.close(fd)
    return "opened /dev/fuse"


def attack_dev_net_tun(T):
    fd = os.open("/dev/net/tun", os.O_RDWR)
    os.close(fd)
    return "opened /dev/net/tun"


def attack_other_workspace_dataset(T):
    # vision's ReadOnly dataset, by its host path (nlp has no drive of it)
    return open(T["vision_dataset"]).read() or os.listdir(os.path.dirname(T["vision_dataset"]))


# Issue 42, item 1: each worker has a network of its own (astraeus.agent.network). Vision's worker listens on TCP
# 0.0.0.0:29555 (a TCPStore-like rendezvous) and on an abstract unix socket, answering with its secret.

def _tcp(host, port):
    import socket

    with socket.create_connection((host, port), timeout=2) as s:
        s.settimeout(2)
        return s.recv(200) or f"connected to {host}:{port}"


def attack_vision_tcp_listener(T):
    return [got for host in (T["vision_addr"], "127.0.0.1", T["machine_addr"])
            if (got := _try(lambda h=host: _tcp(h, 29555)))]


def attack_vision_abstract_socket(T):
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect("\0" + T["tag"])
        return s.recv(200)


def attack_machine_services(T):
    # the control plane, PostgreSQL and the image registry wherever they listen on the machine
    return [got for host, port in T["services"] if (got := _try(lambda h=host, p=port: _tcp(h, p)))]


def attack_vision_sockets_in_proc_net(T):
    tcp = [ln for ln in open("/proc/net/tcp").read().splitlines()[1:] if ":7363 " in ln]  # 29555
    unix = [ln for ln in open("/proc/net/unix").read().splitlines() if T["tag"] in ln]
    return tcp + unix


def _try(fn):
    try:
        return fn()
    except OSError:
        return None


ATTACKS = [f for name, f in sorted(globals().items()) if name.startswith("attack_")]

PRELUDE = r'''
import json, os, signal, sys
T = json.loads(sys.argv[1])
print(f"INFO uid={os.getuid()} gid={os.getgid()}", flush=True)
print("INFO " + " ".join(ln.strip().replace(":\t", "=") for ln in open("/proc/self/status")
                         if ln.startswith(("CapEff", "CapBnd", "NoNewPrivs"))), flush=True)
def step(name, fn):
    try:
        got = fn(T)
    except BaseException as e:
        print(f"BLOCKED {name}: {type(e).__name__}: {e}", flush=True)
        return
    print(f"REACHED {name}: {str(got)[:200]}" if got else f"BLOCKED {name}: nothing", flush=True)
'''


def hostile_script() -> str:
    parts = [PRELUDE, textwrap.dedent(inspect.getsource(_tcp)), textwrap.dedent(inspect.getsource(_try))]
    for f in ATTACKS:
        parts.append(textwrap.dedent(inspect.getsource(f)))
        parts.append(f"step({f.__name__[len('attack_'):]!r}, {f.__name__})\n")
    parts.append('print("DONE", flush=True)\nimport time\ntime.sleep(3600)\n')
    return "\n".join(parts)


VISION = r'''
import ctypes, os, sys, time
# a System V shared memory segment with a known key (sys.argv[1]), holding the secret (nlp's worker must not reach it)
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
shmid = libc.shmget(int(sys.argv[1]), 4096, 0o1000 | 0o666)  # IPC_CREAT
addr = libc.shmat(shmid, None, 0) if shmid >= 0 else None
if addr not in (None, ctypes.c_void_p(-1).value):
    ctypes.memmove(addr, os.environ["VISION_SECRET"].encode(), len(os.environ["VISION_SECRET"]))
    print("shm ready", flush=True)
else:
    print(f"shm failed: {os.strerror(ctypes.get_errno())}", flush=True)
print("dataset " + open("/adata/train.csv").read().strip().replace("\n", "|"), flush=True)
import socket, threading
def serve(sock):
    while True:
        c, _ = sock.accept()
        c.sendall(os.environ["VISION_SECRET"].encode())
        c.close()
tcp = socket.socket()
tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind(("0.0.0.0", 29555))
tcp.listen()
unix = socket.socket(socket.AF_UNIX)
unix.bind("\0" + sys.argv[2])
unix.listen()
for s in (tcp, unix):
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print("listening at " + os.environ.get("ASTRAEUS_WORKER_ADDR", "the machine's address"), flush=True)
i = 0
while True:
    with open("/vckpt/progress", "a") as f:
        f.write(f"{i}\n")
    print(i, flush=True)
    i += 1
    time.sleep(0.3)
'''


def _run(name: str, code: str, args: list[str], env: dict, configs: list[dict], drives: list[dict],
         image: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": image, "command": "python", "args": ["-c", code, *args], "env": env,
        "restart_policy": "Never", "configs": configs, "datavolume_refs": drives,
        "requested_resources": {"cpu_cores": 1, "memory_bytes": 1 << 29, "gpu_requests": {"count": 1}}}}}


def _registry(runtime) -> list[tuple[str, int]]:
    """The local image registry the container variant pulls from (127.0.0.1:PORT), as (host, port)."""
    host, _, rest = runtime.image.partition("/")
    if runtime.kind != "container" or ":" not in host:
        return []
    return [(host.split(":")[0], int(host.split(":")[1]))]


def _drive(name: str, path: str, mount: str, mode: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"sources": [
        {"node": "gpu-01", "path": path, "mount_path": mount, "mode": mode}],
        "transport": "Auto", "permissions": {"create": True}}}


def _agent_pid(state_dir: Path) -> int:
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cmd = open(f"/proc/{name}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if b"agent" in cmd and any(str(state_dir).encode() in c for c in cmd):
                return int(name)
    env_pids = [int(n) for n in os.listdir("/proc") if n.isdigit() and _has_env(int(n), b"ASTRAEUS_MACHINE_TOKEN=")]
    assert env_pids, "the agent's process"
    return env_pids[0]


def _has_env(pid: int, prefix: bytes) -> bool:
    try:
        return any(x.startswith(prefix) for x in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"))
    except OSError:
        return False


@pytest.fixture
def cluster(runtime):
    """A real `astraeus up` whose home (env with tokens, the database, the agent's state dir) is NOT under /tmp,
    so that hiding them is what keeps them from the worker (not its private /tmp); its machine uses the test's
    runtime."""
    from .conftest import cluster_on

    with cluster_on(runtime, "astraeus-hostile-") as c:
        yield c


# In a container, /root is the worker's own HOME in its own layer of the image (the host's /root is not in its
# view): writing there reaches nothing of the host's, which the host-side check below proves (/root/<tag>-root).
OWN_LAYER = {"process": set(), "container": {"write_root"}}


def test_a_hostile_tenant_reaches_nothing_and_the_other_tenant_runs_on(cluster, runtime):
    tag = f"astraeus-hostile-{uuid.uuid4().hex[:8]}"
    base = Path("/data/astraeus") / tag
    (base / "nro").mkdir(parents=True)
    (base / "nro" / "data.txt").write_text("read-only data")
    (base / "a-dataset").mkdir()
    (base / "a-dataset" / "train.csv").write_text("x,y\n1,vision-only\n")
    shm_key = 0x41000000 | (uuid.uuid4().int & 0xFFFFFF)  # vision's System V shared memory segment
    host_made = [Path(f"/etc/{tag}"), Path(f"/opt/{tag}"), Path(f"/etc/{tag}-etc"), Path(f"/root/{tag}-root")]
    try:
        with cluster.admin() as adm:
            r = adm.post("/workspaces", json={"name": "nlp", "clusters": {"main": {"host_paths": ["/data/astraeus"]}}})
            assert r.status_code == 201, r.text
            nlp_token = adm.post("/tokens", json={"kind": "user", "workspace": "nlp", "role": "editor"}).json()["token"]
        nlp_api = cluster.api.replace("/w/vision", "/w/nlp")
        secret = f"vision-secret-{uuid.uuid4().hex}"
        with cluster.client() as vis:
            r = vis.post("/drives", json=_drive("vckpt", str(base / "vision"), "/vckpt", "ReadWrite"))
            assert r.status_code == 201, r.text
            r = vis.post("/drives", json=_drive("adata", str(base / "a-dataset"), "/adata", "ReadOnly"))
            assert r.status_code == 201, r.text
            r = vis.post("/runs", json=_run("vlong", VISION, [str(shm_key), tag], {"VISION_SECRET": secret},
                                            [{"mounts": ["/etc/vision/conf.yaml"], "value": f"config-{secret}"}],
                                            [{"name": "vckpt", "mount_path": "/vckpt", "mode": "ReadWrite"},
                                             {"name": "adata", "mount_path": "/adata", "mode": "ReadOnly"}],
                                            cluster.image))
            assert r.status_code == 201, r.text
            vlog = wait_for(lambda: (t := vis.get("/workers/vlong-0/logs").text).count("\n") >= 5 and t,
                            timeout=60, what="vision's worker printing")
            # what nlp's steps aim at is really there for vision: its shared memory segment and its dataset
            assert "shm ready" in vlog and "dataset x,y|1,vision-only" in vlog, vlog
            vision_addr = re.search(r"^listening at (\S+)$", vlog, re.M)[1]  # its own address
            assert vision_addr != "the machine's", vlog
            # vision's listeners answer vision's own gang (here: the host, which reaches its worker) with the secret
            assert _tcp(vision_addr, 29555) == secret.encode()
        state_dir = cluster.home / "agents" / "gpu-01"
        vision_pid = wait_for(lambda: next((p for p, w in worker_procs(state_dir).items() if "vlong" in w), None),
                              what="vision's worker process")
        vision_dir = next(n for n in os.listdir(state_dir / "workers") if "vlong" in n)
        with cluster.client() as vis:
            machine_addr = vis.get("/machines").json()["items"][0]["address"] or "127.0.0.1"
        with cluster.client() as vis:
            before = vis.get("/workers/vlong-0").json()
        targets = {"agent_pid": _agent_pid(state_dir), "home": str(cluster.home), "state_dir": str(state_dir),
                   "vision_dir": vision_dir, "vision_pid": vision_pid, "vision_secret": secret,
                   "vision_drive": str(base / "vision"), "shim": os.path.realpath(shim_module.__file__),
                   "ro_drive": str(base / "nro"), "tag": tag, "shm_key": shm_key,
                   "vision_dataset": str(base / "a-dataset" / "train.csv"), "vision_addr": vision_addr,
                   "machine_addr": machine_addr,
                   "services": [("127.0.0.1", cluster.port), (machine_addr, cluster.port), ("127.0.0.1", 5432),
                                *_registry(runtime)]}
        shim_before = Path(targets["shim"]).read_bytes()
        with cluster.client(nlp_token) as nlp:
            nlp.base_url = nlp_api
            r = nlp.post("/drives", json=_drive("nro", str(base / "nro"), "/ro", "ReadOnly"))
            assert r.status_code == 201, r.text
            configs = [{"mounts": [f"/etc/{tag}"], "value": "x"}, {"mounts": [f"/opt/{tag}/y"], "value": "y"},
                       {"mounts": [str(state_dir / "workers" / vision_dir / "stop.json")], "value": "{}"}]
            r = nlp.post("/runs", json=_run("attack", hostile_script(), [json.dumps(targets)], {}, configs,
                                            [{"name": "nro", "mount_path": "/ro", "mode": "ReadOnly"}], cluster.image))
            assert r.status_code == 201, r.text
            logs = wait_for(lambda: (t := nlp.get("/workers/attack-0/logs").text) and "DONE" in t and t,
                            timeout=60, what="the hostile worker's steps")
        lines = logs.splitlines()
        own = OWN_LAYER[runtime.kind]
        reached = [ln for ln in lines if ln.startswith("REACHED") and ln.split()[1].rstrip(":") not in own]
        assert not reached, "\n".join(reached)
        blocked = {ln.split()[1].rstrip(":") for ln in lines if ln.startswith("BLOCKED")}
        assert blocked | own == {f.__name__[len("attack_"):] for f in ATTACKS}, lines
        info = " ".join(ln for ln in lines if ln.startswith("INFO"))
        assert "uid=0 " not in info and "CapEff=0000000000000000" in info and "CapBnd=0000000000000000" in info, info
        assert "NoNewPrivs=1" in info, info

        # nothing appeared on the host
        for p in host_made:
            assert not p.exists(), p
        assert not (state_dir / "workers" / vision_dir / "stop.json").exists()
        assert Path(targets["shim"]).read_bytes() == shim_before
        assert sorted(os.listdir(base / "nro")) == ["data.txt"]

        # vision's worker runs on, untouched, and still stops when asked
        with cluster.client() as vis:
            after = vis.get("/workers/vlong-0").json()
            assert after["state"] == "Running" and after.get("attempt") == before.get("attempt"), after
            assert pid_alive(vision_pid)
            n = vis.get("/workers/vlong-0/logs").text.count("\n")
            wait_for(lambda: vis.get("/workers/vlong-0/logs").text.count("\n") > n + 2, timeout=20,
                     what="vision's log growing")
            assert secret not in logs
            assert vis.delete("/runs/vlong").status_code in (200, 202, 204)
            wait_for(lambda: not pid_alive(vision_pid), timeout=20, what="vision's worker stopped")
        with cluster.client(nlp_token) as nlp:
            nlp.base_url = nlp_api
            nlp.delete("/runs/attack")
    finally:
        shutil.rmtree(base, ignore_errors=True)
        for p in host_made:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            elif p.exists():
                p.unlink()
