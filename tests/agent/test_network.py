"""Per-worker networks (astraeus.agent.network, issue 42 items 1 and 2).

The pure parts are tested with tables of cases. The rest runs on real namespaces, never in the host's own network
namespace: the test makes an "outside" namespace (a bridge with a public-looking 198.51.100.1, a private "lan"
10.99.0.1 and 169.254.169.254) and two "machine" namespaces on that bridge (198.51.100.1x and 10.99.0.1x); each
WorkerNetworks call runs in a child process entered into a machine namespace (this file run as a script, through
`nsenter --net`), as an agent in a `--netns` machine would. Listeners and probes run in the workers' namespaces.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from astraeus.agent import network as N

PORT = 29555
SECRET = "the-secret-of-a"
HERE = os.path.abspath(__file__)


# ------------------------------------------------------------------------------------------------ pure


@pytest.mark.parametrize("pool,used,want", [
    ("100.127.0.0/16", [], "100.127.0.1"),
    ("100.127.0.0/16", ["100.127.0.1", "100.127.0.2"], "100.127.0.3"),
    ("100.127.0.0/16", ["100.127.0.2"], "100.127.0.1"),
    ("100.127.0.0/16", ["100.127.0.1", "10.0.0.1", "100.127.0.3"], "100.127.0.2"),
    ("100.127.0.0/16", [f"100.127.0.{i}" for i in range(1, 256)], "100.127.1.0"),
    ("10.1.2.0/30", ["10.1.2.1"], "10.1.2.2"),
    ("10.1.2.8/31", [], "10.1.2.8"),
])
def test_choose_address(pool, used, want):
    assert N.choose_address(pool, used) == want


def test_choose_address_full_pool():
    with pytest.raises(N.NetworkError, match="no free worker address in 10.1.2.0/30"):
        N.choose_address("10.1.2.0/30", ["10.1.2.1", "10.1.2.2"])


ROUTE = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t0164330A\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth0\t0064330A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
aw12ab012345678\t01007F64\t00000000\t0005\t0\t0\t0\tFFFFFFFF\t0\t0\t0
eth0\t02007E64\t0C64330A\t0007\t0\t0\t0\tFFFFFFFF\t0\t0\t0
"""

FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     |-- 10.51.100.11
        /32 host LOCAL
     |-- 100.127.0.1
        /32 link UNICAST
"""


def test_proc_parsing():
    assert N.host_routes(ROUTE) == {"100.127.0.1": "aw12ab012345678", "100.126.0.2": "eth0"}
    assert N.default_interface(ROUTE) == "eth0"
    assert N.local_addresses(FIB_TRIE) == {"127.0.0.1", "10.51.100.11"}


def test_names():
    key = "run-" + "x" * 120 + "-attempt-3"  # a worker attempt's folder name
    name = N.netns_name("gpu-01", key)
    iface = N.interface_for("gpu-01", name)
    assert name.startswith("astraeus-gpu_01-") and len(name) == len("astraeus-gpu_01-") + 9
    assert len(iface) == 15 and iface.startswith(N.owner_tag("gpu-01")) and iface.startswith("aw")
    assert N.netns_name("gpu-01", key) == name and N.netns_name("gpu-02", key) != name
    assert N.owner_tag("gpu-01") != N.owner_tag("gpu-02")
    assert N.sanitize_owner("GPU-01.a") == "gpu_01_a" and len(N.sanitize_owner("y" * 80)) == 32
    assert N.table_name("gpu-01") == "astraeus_gpu_01"


def test_batches():
    h = N.host_batch("astraeus-o-0123456789abc", "awabcd012345678", "100.127.0.1", 1500).splitlines()
    assert h[0] == "netns add astraeus-o-0123456789abc"
    assert "peer name eth0" in h[1] and h[1].endswith("netns astraeus-o-0123456789abc")
    assert h[3] == "route add 100.127.0.1/32 dev awabcd012345678 scope link"
    inside = N.inside_batch("100.127.0.1")
    assert "addr add 100.127.0.1/32 dev eth0" in inside and "route add default via 169.254.1.1 dev eth0" in inside
    assert N.elements_batch("o", {("1.1.1.1", "2.2.2.2")}, set()) == \
        "add element inet astraeus_o peers { 1.1.1.1 . 2.2.2.2 }\n"
    assert N.elements_batch("o", set(), set()) == ""
    assert N.pairs("1.1.1.1", [N.Peer("2.2.2.2"), N.Peer("3.3.3.3", "10.0.0.3")]) == {
        ("1.1.1.1", "2.2.2.2"), ("2.2.2.2", "1.1.1.1"), ("1.1.1.1", "3.3.3.3"), ("3.3.3.3", "1.1.1.1")}


@pytest.mark.parametrize("policy,has,lacks", [
    (N.Policy(), ['iifname "{w}" drop', "set peers { type ipv4_addr . ipv4_addr;", "10.0.0.0/8", "169.254.0.0/16",
                  "127.0.0.0/8", "@blocked drop", "@resolvers udp dport 53 accept", "10.255.255.53",
                  "delete table inet astraeus_o", "fib saddr . iif oif missing drop", "masquerade",
                  "1.1.1.1 . 2.2.2.2", 'oifname "{w}" drop'],
     ["203.0.113.0"]),
    (N.Policy(blocked=("203.0.113.7",), allowed=("10.1.0.0/16",)), ["203.0.113.7", "10.1.0.0/16"], []),
    (N.Policy(blocked=("10.1.2.3",)), ["10.0.0.0/8"], ["10.1.2.3"]),  # merged into 10/8
    (N.Policy(egress="none"), ['iifname "{w}" drop'], ["@blocked drop", "@resolvers"]),
    (N.Policy(egress="all", blocked=("192.0.2.10",)), ["192.0.2.10", "@blocked drop"], ["10.0.0.0/8"]),
])
def test_ruleset(policy, has, lacks):
    text = N.ruleset("o", policy, ["10.255.255.53"], [("1.1.1.1", "2.2.2.2")])
    w = N.owner_tag("o") + "*"
    for s in has:
        assert s.replace("{w}", w) in text, s
    for s in lacks:
        assert s not in text, s
    assert text.index(f'iifname "{w}" ip saddr . ip daddr @peers accept') < text.index(f'oifname "{w}" drop')


def test_policy_checked():
    with pytest.raises(ValueError, match="egress"):
        N.check_policy(N.Policy(egress="some"))
    with pytest.raises(ValueError, match="not an IPv4"):
        N.check_policy(N.Policy(blocked=("example.com",)))


RESOLVED_STUB = "# systemd-resolved\nnameserver 127.0.0.53\noptions edns0 trust-ad\nsearch corp.example\n"


@pytest.mark.parametrize("host,upstream,servers,kept", [
    ("nameserver 10.255.255.53\n", None, ["10.255.255.53"], []),
    ("nameserver 8.8.8.8\nnameserver 2001:4860:4860::8888\nnameserver 1.1.1.1\n", None, ["8.8.8.8", "1.1.1.1"], []),
    (RESOLVED_STUB, "nameserver 192.0.2.53\nnameserver 192.0.2.54\n", ["192.0.2.53", "192.0.2.54"],
     ["options edns0 trust-ad", "search corp.example"]),
    (RESOLVED_STUB, None, [], ["search corp.example"]),
    ("nameserver 127.0.0.1\nnameserver 9.9.9.9\n", "nameserver 192.0.2.53\n", ["9.9.9.9"], []),
    ("", "nameserver 192.0.2.53\n", [], []),
])
def test_worker_resolv_conf(host, upstream, servers, kept):
    text = N.worker_resolv_conf(host, upstream)
    assert N.nameservers(text) == servers
    for line in kept:
        assert line in text.splitlines()


# ------------------------------------------------------------------------------------------------ namespaces


def _skip_reason() -> str | None:
    why = N.unavailable()
    if why:
        return f"per-worker networks {why}"
    if not shutil.which("nsenter"):
        return "needs util-linux's nsenter"
    return None


def ip(*args: str, check: bool = True) -> str:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and p.returncode:
        raise AssertionError(f"ip {' '.join(args)}: {p.stderr.strip()}")
    return p.stdout


def in_ns(netns: str, argv: list[str]) -> list[str]:
    path = netns if netns.startswith("/") else f"{N.NETNS_DIR}/{netns}"
    return ["nsenter", f"--net={path}", "--", *argv]


class Fabric:
    """Three namespaces on a bridge: `out` (the internet and a lan), machines `m1` and `m2`; everything made here
    is removed by `close`."""

    def __init__(self, tmp):
        r = uuid.uuid4().hex[:6]
        self.out, self.m1, self.m2 = f"astx-out-{r}", f"astx-m1-{r}", f"astx-m2-{r}"
        self.run_dir = str(tmp)
        self.owners: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self.addr = {self.m1: ("198.51.100.11", "10.99.0.11"), self.m2: ("198.51.100.12", "10.99.0.12")}

    def make(self):
        for ns in (self.out, self.m1, self.m2):
            ip("netns", "add", ns)
        o = self.out
        ip("-n", o, "link", "set", "lo", "up")
        ip("-n", o, "link", "add", "br0", "type", "bridge")
        for a in ("198.51.100.1/24", "10.99.0.1/24"):
            ip("-n", o, "addr", "add", a, "dev", "br0")
        ip("-n", o, "addr", "add", "169.254.169.254/32", "dev", "lo")
        ip("-n", o, "link", "set", "br0", "up")
        for i, m in enumerate((self.m1, self.m2), 1):
            pub, lan = self.addr[m]
            ip("-n", m, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}", "netns", o)
            ip("-n", o, "link", "set", f"p{i}", "master", "br0", "up")
            ip("-n", m, "addr", "add", f"{pub}/24", "dev", "eth0")
            ip("-n", m, "addr", "add", f"{lan}/24", "dev", "eth0")
            ip("-n", m, "link", "set", "eth0", "up")
            ip("-n", m, "link", "set", "lo", "up")
            ip("-n", m, "route", "add", "default", "via", "198.51.100.1")

    def owner(self, tag: str) -> str:
        o = f"t{uuid.uuid4().hex[:5]}{tag}"
        self.owners.append(o)
        return o

    def agent(self, machine: str, op: str, **args):
        """Run WorkerNetworks.<op> in a child entered into `machine`'s namespace; its JSON answer."""
        args.setdefault("run_dir", self.run_dir)
        p = subprocess.run(in_ns(machine, [sys.executable, HERE, "agent", op, json.dumps(args)]),
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, f"{op} {args} in {machine}: {p.stderr[-3000:]}"
        return json.loads(p.stdout.splitlines()[-1])

    def listen(self, netns: str, host: str, port: int, secret: str, abstract: str = "") -> None:
        p = subprocess.Popen(in_ns(netns, [sys.executable, HERE, "listen", host, str(port), secret, abstract]),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        line = p.stdout.readline()
        assert line.strip() == "ready", f"listener {host}:{port} in {netns}: {line!r} {p.stderr.read()[-2000:]}"

    def probe(self, netns: str, targets: dict[str, tuple], **extra) -> dict[str, str]:
        """Connect from inside `netns` to each target (host, port[, source]); {label: "REACHED <secret>" or
        "BLOCKED <why>"}."""
        p = subprocess.run(in_ns(netns, [sys.executable, HERE, "probe", json.dumps({"targets": targets, **extra})]),
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr[-3000:]
        out = json.loads(p.stdout.splitlines()[-1])
        for label, r in sorted(out.items()):
            print(f"{netns}: {label}: {r}")
        return out

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        ours = [n for n in os.listdir(N.NETNS_DIR) if any(n.startswith(f"astraeus-{o}-") for o in self.owners)] \
            if os.path.isdir(N.NETNS_DIR) else []
        for ns in [*ours, self.m1, self.m2, self.out]:
            if os.path.exists(f"{N.NETNS_DIR}/{ns}"):
                for pid in ip("netns", "pids", ns, check=False).split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (OSError, ValueError):
                        pass
                ip("netns", "del", ns, check=False)


@pytest.fixture(scope="module")
def fabric(tmp_path_factory):
    why = _skip_reason()
    if why:
        pytest.skip(why)
    f = Fabric(tmp_path_factory.mktemp("netrun"))
    try:
        try:
            f.make()
        except AssertionError as e:
            pytest.skip(f"cannot make test namespaces here: {e}")
        yield f
    finally:
        f.close()


def reached(r: str) -> bool:
    return r.startswith("REACHED")


def test_worker_isolation(fabric):
    f, m1 = fabric, fabric.m1
    pub, lan = f.addr[m1]
    owner = f.owner("iso")
    f.agent(m1, "setup", owner=owner, policy={"blocked": ["198.51.100.99"]})
    a = f.agent(m1, "create", owner=owner, key="run-a/attempt-1")
    b = f.agent(m1, "create", owner=owner, key="run-b/attempt-1")
    assert a["address"] == "100.127.0.1" and b["address"] == "100.127.0.2"
    abstract = f"astraeus-secret-{uuid.uuid4().hex[:6]}"
    f.listen(a["path"], "0.0.0.0", PORT, SECRET, abstract)
    f.listen(m1, "127.0.0.1", 29601, "machine-loopback")
    f.listen(m1, lan, 29602, "machine-lan")
    f.listen(m1, pub, 29603, "machine-public")
    f.listen(f.out, "198.51.100.1", 29604, "internet")
    f.listen(f.out, "10.99.0.1", 29605, "lan")
    f.listen(f.out, "169.254.169.254", 29606, "metadata")
    f.listen(f.out, "198.51.100.1", 29607, "control-plane")  # stands for a public control plane address...
    targets = {
        "A's address": (a["address"], PORT), "own loopback on A's port": ("127.0.0.1", PORT),
        "machine 127.0.0.1": ("127.0.0.1", 29601), "machine lan": (lan, 29602), "machine public": (pub, 29603),
        "gateway 169.254.1.1": ("169.254.1.1", 29601),
        "outside lan": ("10.99.0.1", 29605), "metadata": ("169.254.169.254", 29606),
        "internet": ("198.51.100.1", 29604),
    }
    got = f.probe(b["path"], targets, abstract=abstract)
    assert reached(got["internet"]) and "internet" in got["internet"]
    for label in targets:
        if label != "internet":
            assert got[label].startswith("BLOCKED"), (label, got[label])
    # item 2: A's abstract socket and listener are not in B's namespace
    assert got["abstract"].startswith("BLOCKED"), got["abstract"]
    assert got["proc tcp lists A's listener"] == "no" and got["proc unix lists A's socket"] == "no"
    # A itself reaches the internet and its own listener
    own = f.probe(a["path"], {"own listener": ("127.0.0.1", PORT), "internet": ("198.51.100.1", 29604)},
                  abstract=abstract)
    assert reached(own["own listener"]) and reached(own["internet"]) and reached(own["abstract"])
    # ...which is the policy's extra blocked address (on a worker of an agent told so)
    f.agent(m1, "setup", owner=owner, policy={"blocked": ["198.51.100.1"]})
    assert not reached(f.probe(b["path"], {"control plane": ("198.51.100.1", 29607)})["control plane"])
    f.agent(m1, "remove", owner=owner, key="run-a/attempt-1")
    f.agent(m1, "remove", owner=owner, key="run-b/attempt-1")
    f.agent(m1, "close", owner=owner)


def test_gang_one_machine_and_across(fabric):
    f, m1, m2 = fabric, fabric.m1, fabric.m2
    o1, o2, o2b = f.owner("m1"), f.owner("m2"), f.owner("m2b")
    f.agent(m1, "setup", owner=o1)
    f.agent(m2, "setup", owner=o2)
    f.agent(m2, "setup", owner=o2b, policy={"egress": "all"})  # a second agent in m2's namespace
    # one machine: g0 and g1 are peers; x is not
    g0 = f.agent(m1, "create", owner=o1, key="g0")
    g1 = f.agent(m1, "create", owner=o1, key="g1", peers=[[g0["address"], None]])
    f.agent(m1, "set_peers", owner=o1, key="g0", address=g0["address"], peers=[[g1["address"], None]])
    x = f.agent(m1, "create", owner=o1, key="x")
    f.listen(g0["path"], "0.0.0.0", PORT, "g0-secret")
    f.listen(g1["path"], "0.0.0.0", PORT, "g1-secret")
    assert reached(f.probe(g1["path"], {"g0": (g0["address"], PORT)})["g0"])
    assert reached(f.probe(g0["path"], {"g1": (g1["address"], PORT)})["g1"])
    assert not reached(f.probe(x["path"], {"g0": (g0["address"], PORT)})["g0"])
    # x (as root in its namespace) sends UDP to g1 from g0's address: the reverse-path check drops it; g0's own
    # datagrams arrive (g1's listener counts them and says so to a TCP client)
    ip("-n", x["name"], "addr", "add", f"{g0['address']}/32", "dev", "eth0")
    f.probe(x["path"], {}, udp=[g1["address"], PORT, g0["address"]])
    assert f.probe(g0["path"], {"g1": (g1["address"], PORT)})["g1"] == "REACHED g1-secret udp=0"
    assert f.probe(g0["path"], {"g1": (g1["address"], PORT)}, udp=[g1["address"], PORT, None])["g1"] == \
        "REACHED g1-secret udp=3"

    # across machines: rank 0 on m1, rank 1 on m2 (addresses from the control plane), routes through the lan
    r0 = f.agent(m1, "create", owner=o1, key="r0", address="100.126.0.1",
                 peers=[["100.126.0.2", f.addr[m2][1]]])
    r1 = f.agent(m2, "create", owner=o2, key="r1", address="100.126.0.2",
                 peers=[["100.126.0.1", f.addr[m1][1]]])
    c = f.agent(m2, "create", owner=o2, key="c")  # not of the gang, same agent as rank 1
    d = f.agent(m2, "create", owner=o2b, key="d")  # another agent (egress "all") in the same namespace
    assert c["address"] != d["address"]  # one pool, two agents: never the same address
    f.listen(r0["path"], "0.0.0.0", PORT, "rank0-secret")
    f.listen(c["path"], "0.0.0.0", PORT, "c-secret")
    f.listen(m2, f.addr[m2][1], 29612, "machine-m2-lan")
    f.listen(f.out, "10.99.0.1", 29615, "lan")
    got = f.probe(r1["path"], {"rank 0": ("100.126.0.1", PORT)})
    assert reached(got["rank 0"]) and "rank0-secret" in got["rank 0"]
    assert not reached(f.probe(c["path"], {"rank 0": ("100.126.0.1", PORT)})["rank 0"])
    got = f.probe(d["path"], {"rank 0": ("100.126.0.1", PORT), "c (other agent's worker)": (c["address"], PORT),
                              "machine m2 lan": (f.addr[m2][1], 29612), "outside lan": ("10.99.0.1", 29615)})
    assert not reached(got["rank 0"]) and not reached(got["c (other agent's worker)"])
    assert not reached(got["machine m2 lan"])
    assert reached(got["outside lan"])  # egress "all": private destinations too

    # rank 0's machine saw rank 1's own address (not masqueraded): its pair let it in
    st = f.agent(m1, "state", owner=o1)
    assert ["100.126.0.1", "100.126.0.2"] in st["elements"] and ["100.126.0.2", "100.126.0.1"] in st["elements"]
    assert "100.126.0.2" in st["routes"] and st["routes"]["100.126.0.2"] == "eth0"
    for machine, owner, keys in ((m1, o1, ["g0", "g1", "x", "r0"]), (m2, o2, ["r1", "c"]), (m2, o2b, ["d"])):
        for k in keys:
            f.agent(machine, "remove", owner=owner, key=k)
        f.agent(machine, "close", owner=owner)


def test_remove_leaves_nothing(fabric):
    f, m1 = fabric, fabric.m1
    owner = f.owner("rm")
    f.agent(m1, "setup", owner=owner)
    f.agent(m1, "setup", owner=owner)  # twice is fine
    w = f.agent(m1, "create", owner=owner, key="w", peers=[["100.126.9.2", f.addr[f.m2][1]],
                                                           ["100.126.9.3", None]])
    v = f.agent(m1, "create", owner=owner, key="v")
    st = f.agent(m1, "state", owner=owner)
    assert sorted(st["existing"]) == sorted([w["name"], v["name"]])
    assert len(st["elements"]) == 4 and st["routes"].get("100.126.9.2") == "eth0"
    f.agent(m1, "setup", owner=owner)  # again, with live workers: their pairs stay
    assert len(f.agent(m1, "state", owner=owner)["elements"]) == 4
    f.agent(m1, "remove", owner=owner, key="w")
    f.agent(m1, "remove", owner=owner, key="w")  # idempotent
    st = f.agent(m1, "state", owner=owner, wait_gone=[w["interface"]])
    assert st["existing"] == [v["name"]]
    assert not os.path.exists(w["path"])
    assert w["interface"] not in st["links"] and v["interface"] in st["links"]
    assert w["address"] not in st["routes"] and "100.126.9.2" not in st["routes"]
    assert st["elements"] == []
    # a failing `ip` names the command and what it said (an address routed already), and leaves nothing
    err = f.agent(m1, "create_error", owner=owner, key="dup", address=v["address"])
    assert "ip -batch -" in err["error"] and f"route add {v['address']}/32" in err["error"], err
    assert "File exists" in err["error"], err
    assert f.agent(m1, "state", owner=owner)["existing"] == [v["name"]]
    f.agent(m1, "remove", owner=owner, key="v")
    f.agent(m1, "remove", owner=owner, key="never-made")
    dup = N.interface_for(owner, N.netns_name(owner, "dup"))
    st = f.agent(m1, "state", owner=owner, wait_gone=[v["interface"], dup])
    assert st["existing"] == [] and not any(x.startswith(N.owner_tag(owner)) for x in st["links"]), st["links"]
    f.agent(m1, "close", owner=owner)
    assert f.agent(m1, "state", owner=owner)["table"] is False


def test_two_agents_in_one_namespace_never_share_an_address(fabric):
    f = fabric
    owners = [f.owner("pa"), f.owner("pb")]
    procs = [subprocess.Popen(in_ns(f.m1, [sys.executable, HERE, "agent", "create_many", json.dumps(
        {"owner": o, "run_dir": f.run_dir, "n": 15})]), stdout=subprocess.PIPE, text=True) for o in owners]
    got = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        got += json.loads(out.splitlines()[-1])["addresses"]
    assert len(got) == 30 and len(set(got)) == 30, sorted(got)
    for o in owners:
        f.agent(f.m1, "remove_many", owner=o, n=15)
        assert f.agent(f.m1, "state", owner=o)["existing"] == []


def test_cost_of_50_workers(fabric):
    f = fabric
    owner = f.owner("bench")
    got = f.agent(f.m2, "bench", owner=owner, n=50)
    print(f"50 workers on {f.m2}: create {got['create_s'] * 1000 / 50:.1f} ms each, remove "
          f"{got['remove_s'] * 1000 / 50:.1f} ms each (wall); CPU (agent + ip/nft children) "
          f"{got['cpu_s'] * 1000 / 50:.1f} ms per worker for both")
    assert len(set(got["addresses"])) == 50
    f.agent(f.m2, "close", owner=owner)


# ------------------------------------------------------------------------------------------------ as a script
# `python test_network.py agent|listen|probe …`, run inside a namespace by the tests above.


def _nets(a: dict) -> N.WorkerNetworks:
    return N.WorkerNetworks(a["owner"], N.Policy(**{k: tuple(v) if isinstance(v, list) else v
                                                    for k, v in a.get("policy", {}).items()}),
                            run_dir=a["run_dir"])


def _agent(op: str, a: dict):
    nets = _nets(a)
    peers = [N.Peer(x, v) for x, v in a.get("peers", [])]
    if op == "setup":
        nets.setup_machine()
    elif op == "create":
        w = nets.create(a["key"], a.get("address"), peers)
        return {"name": w.name, "path": w.path, "address": w.address, "interface": w.interface}
    elif op == "create_error":
        try:
            nets.create(a["key"], a.get("address"), peers)
        except N.NetworkError as e:
            return {"error": str(e)}
        return {"error": None}
    elif op == "set_peers":
        nets.set_peers(a["key"], a["address"], peers)
    elif op == "remove":
        nets.remove(a["key"])
    elif op == "create_many":
        return {"addresses": [nets.create(f"w{i}").address for i in range(a["n"])]}
    elif op == "remove_many":
        for i in range(a["n"]):
            nets.remove(f"w{i}")
    elif op == "close":
        nets.close_machine()
    elif op == "state":
        def links():
            return [ln.split(":")[1].strip().split("@")[0] for ln in ip("-o", "link").splitlines()]

        end = time.monotonic() + 10  # a removed worker's veth goes with its namespace, in the background
        while set(a.get("wait_gone", [])) & set(links()) and time.monotonic() < end:
            time.sleep(0.02)
        table = subprocess.run(["nft", "list", "table", "inet", nets.table], capture_output=True).returncode == 0
        return {"existing": nets.existing(), "links": links(), "table": table,
                "routes": N.host_routes(open("/proc/self/net/route").read()),
                "elements": sorted(list(x) for x in nets._set_elements())}
    elif op == "bench":
        import resource

        def cpu():
            s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

        nets.setup_machine()
        c0, t0 = cpu(), time.perf_counter()
        made = [nets.create(f"bench-{i}") for i in range(a["n"])]
        t1 = time.perf_counter()
        for i in range(a["n"]):
            nets.remove(f"bench-{i}")
        t2 = time.perf_counter()
        return {"create_s": t1 - t0, "remove_s": t2 - t1, "cpu_s": cpu() - c0,
                "addresses": [w.address for w in made]}
    return {}


def _listen(host: str, port: int, secret: str, abstract: str) -> None:
    """Answer each TCP (and abstract unix) connection with the secret and the number of UDP datagrams received."""
    socks = []
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    socks.append(s)
    if abstract:
        u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        u.bind("\0" + abstract)
        socks.append(u)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((host, port))
    received = [0]

    def count():
        while True:
            udp.recv(100)
            received[0] += 1

    def serve(sock):
        sock.listen(16)
        while True:
            conn, _ = sock.accept()
            try:
                conn.sendall(f"{secret} udp={received[0]}".encode())
            finally:
                conn.close()

    threading.Thread(target=count, daemon=True).start()
    for x in socks:
        threading.Thread(target=serve, args=(x,), daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()


def _connect(family, addr, timeout: float = 1.5, source: str | None = None) -> str:
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            if source:
                s.bind((source, 0))
            s.connect(addr)
            data = s.recv(100)
        return f"REACHED {data.decode(errors='replace')}"
    except OSError as e:
        return f"BLOCKED ({type(e).__name__}: {e})"


def _probe(a: dict) -> dict:
    out: dict[str, str] = {}
    if a.get("udp"):
        host, port, source = a["udp"]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            if source:
                u.bind((source, 0))
            for _ in range(3):
                u.sendto(b"x", (host, port))
        time.sleep(0.3)

    def one(label, host, port, source=None):
        out[label] = _connect(socket.AF_INET, (host, port), source=source)

    ts = [threading.Thread(target=one, args=(k, *t)) for k, t in a["targets"].items()]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if a.get("abstract"):
        out["abstract"] = _connect(socket.AF_UNIX, "\0" + a["abstract"])
        tcp = open("/proc/net/tcp").read()
        out["proc tcp lists A's listener"] = "yes" if f":{PORT:04X} 00000000:0000 0A" in tcp else "no"
        out["proc unix lists A's socket"] = "yes" if a["abstract"] in open("/proc/net/unix").read() else "no"
    return out


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "agent":
        print(json.dumps(_agent(sys.argv[2], json.loads(sys.argv[3]))))
    elif cmd == "listen":
        _listen(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else "")
    elif cmd == "probe":
        print(json.dumps(_probe(json.loads(sys.argv[2]))))
