"""`astraeus up --netns`: each machine's agent in its own network namespace with its own address on a bridge,
reaching the control plane at the bridge's address; every namespace and link removed on exit, on Ctrl-C, and
(after a crash) by the next `up` in that home. The naming and addressing rules are checked on their own."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from astraeus.fleet import netns
from tests.conftest import VENV_BIN, free_port, start_cluster, wait_for
from tests.faults.conftest import sleeper_run

needs_netns = pytest.mark.skipif(netns.unavailable() is not None, reason=f"--netns {netns.unavailable()}")


def _ours(home: Path) -> tuple[list[str], list[str]]:
    """The namespaces and links on this host with the prefix of the cluster in `home`."""
    prefix = netns.prefix_for(home) + "-"
    ns = [n for n in netns.netns_names(netns.ip("netns", "list").stdout) if n.startswith(prefix)]
    links = [n for n in netns.link_names(netns.ip("-o", "link").stdout) if n.startswith(prefix)]
    return ns, links


def _machines(c) -> dict[str, dict]:
    return {m["name"]: m for m in c.get("/machines").json()["items"]}


def _inode(path: str) -> int:
    return os.stat(path).st_ino


# ------------------------------------------------------------------------------------------ naming and addressing


def test_names_fit_the_kernel_and_differ_per_home(tmp_path):
    a = netns.plan(tmp_path / "a", [f"gpu-{i:02d}" for i in range(1, 254)], [])
    b = netns.plan(tmp_path / "b", ["gpu-01"], [])
    assert a.prefix != b.prefix and a.prefix == netns.prefix_for(tmp_path / "a")
    names = [a.bridge, *(m.host_link for m in a.machines)]
    assert max(len(n) for n in names) <= 15 and len(set(names)) == len(names)
    assert all(n.startswith(a.prefix + "-") for n in names + [m.netns for m in a.machines])
    net = ipaddress.ip_network(a.subnet)
    assert ipaddress.ip_address(a.gateway) == next(net.hosts())
    addrs = [ipaddress.ip_address(m.address) for m in a.machines]
    assert len(set(addrs)) == 253 and all(x in net and str(x) != a.gateway for x in addrs)
    # the same home gets the same plan; the record reads back
    assert netns.plan(tmp_path / "a", ["gpu-01"], []).subnet == a.subnet
    assert netns.Layout.from_json(b.to_json()) == b


def test_subnet_avoids_the_hosts_networks(tmp_path):
    first = netns.plan(tmp_path / "a", ["gpu-01"], [])
    taken = netns.networks_in_use(
        f"4: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\n"
        f"9: ax-br    inet {first.gateway}/24 scope global ax-br\n",
        "default via 192.0.2.1 dev eth0\n10.0.0.0/8 dev tun0 scope link\n")
    assert ipaddress.ip_network(first.subnet) in taken
    # 10.0.0.0/8 covers the whole pool: nothing is free
    with pytest.raises(netns.NetnsError, match="in use on this host"):
        netns.plan(tmp_path / "a", ["gpu-01"], taken)
    second = netns.plan(tmp_path / "a", ["gpu-01"], taken[:2])  # the default route is no conflict
    assert second.subnet != first.subnet
    assert not ipaddress.ip_network(second.subnet).overlaps(ipaddress.ip_network("192.0.2.0/24"))


def test_bad_plans_say_what_to_change(tmp_path):
    with pytest.raises(ValueError, match="at most 253"):
        netns.plan(tmp_path, [f"m{i}" for i in range(254)], [])
    with pytest.raises(ValueError, match="machine name 'a b'"):
        netns.plan(tmp_path, ["a b"], [])


# ------------------------------------------------------------------------------------------ on this host


@needs_netns
def test_create_cut_heal_destroy(tmp_path):
    home = tmp_path / "home"
    lay = netns.plan(home, ["gpu-01", "gpu-02"], netns.networks_taken())
    netns.save(home, lay)
    try:
        netns.create(lay)
        # a second fleet planned now does not take this one's subnet (it is in `ip -4 addr`)
        assert netns.plan(home, ["gpu-01"], netns.networks_taken()).subnet != lay.subnet
        one, two = lay.machines
        out = netns.run_in(one.netns, ["ip", "-4", "-o", "addr"]).stdout
        assert f"inet {one.address}/24" in out and two.address not in out and "inet 127.0.0.1/8" in out

        def reach(src, dst) -> int:
            code = f"import socket; socket.create_connection(({dst!r}, 9), timeout=1.5)"
            return netns.run_in(src.netns, ["python3", "-c", code]).returncode

        # port 9 is closed: "connection refused" (1) proves the peer answered; a cut times out (also 1), so
        # compare the error texts instead
        def error(src, dst) -> str:
            code = (f"import socket\ntry:\n socket.create_connection(({dst!r}, 9), timeout=1.5)\n"
                    f"except OSError as e:\n print(type(e).__name__)")
            return netns.run_in(src.netns, ["python3", "-c", code]).stdout.strip()

        assert error(one, two.address) == "ConnectionRefusedError"
        assert error(one, lay.gateway) == "ConnectionRefusedError"
        netns.cut(lay, "gpu-01")
        assert error(one, lay.gateway) in ("TimeoutError", "OSError")
        assert error(two, one.address) in ("TimeoutError", "OSError")
        assert error(two, lay.gateway) == "ConnectionRefusedError"
        netns.heal(lay, "gpu-01")
        assert wait_for(lambda: error(one, lay.gateway) == "ConnectionRefusedError", timeout=10, what="healed")
    finally:
        netns.destroy(lay)
        netns.destroy(lay)  # idempotent
    assert _ours(home) == ([], [])
    with pytest.raises(netns.NetnsError, match="no machine 'gpu-09'"):
        netns.cut(lay, "gpu-09")


@needs_netns
def test_up_netns_two_machines_with_their_own_addresses(tmp_path):
    home = tmp_path / "home"
    lab = tmp_path / "lab"
    lab.mkdir()
    c = start_cluster(home, machines=2, gpus=2, extra_args=["--netns", "--shared-fs", f"lab={lab}"])
    try:
        lay = netns.load(home)
        assert lay is not None and [m.name for m in lay.machines] == ["gpu-01", "gpu-02"]
        ns, links = _ours(home)
        assert sorted(ns) == sorted(m.netns for m in lay.machines)
        assert c.server == f"http://{lay.gateway}:{c.port}" and c.api.startswith(c.server)
        with c.client() as cl:
            ms = wait_for(lambda: (m := _machines(cl)) and len(m) == 2
                          and all(x["state"] == "Ready" for x in m.values()) and m, what="2 machines Ready")
            assert {n: m.get("address") for n, m in ms.items()} == {m.name: m.address for m in lay.machines}
            assert ms["gpu-01"]["address"] != ms["gpu-02"]["address"]
            # --shared-fs reached every agent
            assert all(m.get("shared_filesystems") == {"lab": str(lab)} for m in ms.values()), ms
        # and in `astra astraeus machines`, the ADDRESS column
        out = subprocess.run([str(VENV_BIN / "astra"), "astraeus", "machines"], capture_output=True, text=True,
                             env=c.env, timeout=60)
        assert out.returncode == 0, out.stderr
        rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()[1:] if line.strip()}
        assert all(m.address in rows[m.name] for m in lay.machines), out.stdout
        with c.client() as cl:
            # a worker on gpu-02 runs in a network namespace of its own (astraeus.agent.network), routed through
            # gpu-02's: its address is its own, neither machine's
            code = ("import os, subprocess\n"
                    "print('netns', os.stat('/proc/self/ns/net').st_ino, flush=True)\n"
                    "print(subprocess.run(['ip', '-4', '-o', 'addr'], capture_output=True, text=True).stdout,"
                    " flush=True)\n")
            run = sleeper_run("where", code=code, restart="Never", names=["gpu-02"])
            assert cl.post("/runs", json=run).status_code == 201
            w = wait_for(lambda: (w := cl.get("/workers/where-0").json())["state"] == "Succeeded" and w,
                         timeout=60, what="where-0 succeeded")
            assert w["machine"] == "gpu-02"
            logs = wait_for(lambda: "netns" in (t := c.logs("where-0")) and t, what="where-0's lines")
        two = lay.machine("gpu-02")
        assert "netns " in logs and f"netns {_inode(f'{netns.NETNS_DIR}/{two.netns}')}" not in logs
        assert re.search(r"inet 100\.127\.\d+\.\d+/32", logs), logs
        assert two.address not in logs and lay.machine("gpu-01").address not in logs
        # Ctrl-C: every namespace and link goes, with the record
        c.proc.send_signal(signal.SIGINT)
        assert c.proc.wait(timeout=60) == 0
        assert _ours(home) == ([], []) and not (home / "netns.json").exists()
    finally:
        c.stop()
        if netns.load(home):
            netns.remove_leftovers(home)


@pytest.mark.faults
@needs_netns
def test_a_crashed_up_leaves_leftovers_the_next_up_removes(tmp_path):
    home = tmp_path / "home"
    c = start_cluster(home, machines=2, gpus=1, extra_args=["--netns"])
    lay = netns.load(home)
    try:
        with c.client() as cl:
            wait_for(lambda: len([m for m in _machines(cl).values() if m["state"] == "Ready"]) == 2,
                     what="2 machines Ready")
        agents = {m.name: netns.pids_in(m.netns) for m in lay.machines}
        assert all(agents.values())
        before = [m.netns for m in lay.machines]
        os.kill(c.proc.pid, signal.SIGKILL)  # the `up` alone: its agents live on in their namespaces
        c.proc.wait()
        ns, links = _ours(home)
        assert sorted(ns) == sorted(before) and lay.bridge in links and (home / "netns.json").exists()

        (home / "env").unlink()  # the crashed one's: start_cluster waits for the new one's
        c = start_cluster(home, machines=2, gpus=1, extra_args=["--netns"])
        log = (home / "up.log").read_text()
        assert f"removed what an earlier `astraeus up` in {home} left: " in log
        assert lay.bridge in log and all(m.netns in log for m in lay.machines)
        for pids in agents.values():  # the crashed cluster's agents were in the old namespaces: gone with them
            wait_for(lambda pids=pids: not any(Path(f"/proc/{p}").exists() for p in pids), timeout=10,
                     what="the old agents gone")
        now = netns.load(home)
        assert now.owner_pid == c.proc.pid
        with c.client() as cl:
            wait_for(lambda: len([m for m in _machines(cl).values() if m["state"] == "Ready"]) == 2,
                     what="2 machines Ready again")
        for m in now.machines:  # new agents in new namespaces
            assert netns.pids_in(m.netns) and not set(netns.pids_in(m.netns)) & set(agents[m.name])
        c.proc.send_signal(signal.SIGTERM)
        assert c.proc.wait(timeout=60) == 0
        assert _ours(home) == ([], [])
    finally:
        c.stop()
        netns.remove_leftovers(home)


# ------------------------------------------------------------------------------------------ bad input


def _up(home: Path, *args: str, env: dict | None = None, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ, ASTRAEUS_RUNTIME="process")
    e.update(env or {})
    return subprocess.run([*(prefix or []), str(VENV_BIN / "astraeus"), "up", "--home", str(home), "--port",
                           str(free_port()), *args], capture_output=True, text=True, env=e, timeout=60)


def test_up_netns_refused_without_ip(tmp_path):
    r = _up(tmp_path / "home", "--netns", env={"PATH": str(VENV_BIN)})
    assert r.returncode == 2, r.stderr
    why = "needs iproute2's `ip` command (apt-get install iproute2)" if os.geteuid() == 0 else "needs root"
    assert r.stderr.strip().splitlines()[-1].startswith(f"astraeus up: --netns {why}"), r.stderr
    assert not (tmp_path / "home" / "netns.json").exists()


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs util-linux's unshare")
def test_up_netns_refused_when_not_root(tmp_path):
    # user 1000 in a user namespace of its own: not root, and still able to read the venv (wherever it lives)
    r = _up(tmp_path / "home", "--netns", prefix=["unshare", "--user", "--map-user=1000", "--map-group=1000"])
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "astraeus up: --netns needs root (network namespaces, veth pairs and a bridge are made with iproute2 as root)"]


@needs_netns
def test_up_bad_netns_and_shared_fs_input(tmp_path):
    r = _up(tmp_path / "home", "--netns", "--machines", "254")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
        "astraeus up: --netns: 254 machines: at most 253 with network namespaces"), r.stderr
    r = _up(tmp_path / "home", "--shared-fs", "lab")
    assert r.returncode == 2 and r.stderr.startswith("astraeus up: --shared-fs 'lab': write NAME=/mnt/path"), r.stderr
    r = _up(tmp_path / "home", "--shared-fs", "lab=relative/dir")
    assert r.returncode == 2 and "astraeus up: --shared-fs 'lab=relative/dir'" in r.stderr, r.stderr
    assert shutil.which("ip") and _ours(tmp_path / "home") == ([], [])


@needs_netns
def test_a_second_up_in_a_live_home_is_refused(tmp_path):
    home = tmp_path / "home"
    c = start_cluster(home, machines=1, gpus=1, extra_args=["--netns"])
    try:
        r = _up(home, "--netns")
        assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
            f"astraeus up: another `astraeus up` (pid {c.proc.pid}) runs in {home}: stop it, or use another "
            f"--home"), r.stderr
        assert json.loads((home / "netns.json").read_text())["owner_pid"] == c.proc.pid
        assert len(_ours(home)[0]) == 1
    finally:
        c.stop()
        netns.remove_leftovers(home)
