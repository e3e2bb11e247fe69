"""Machines with their own addresses on one host: a bridge, and for each machine a network namespace joined to
it by a veth pair, with its own address on the bridge's subnet. The host keeps the subnet's first address on the
bridge (the gateway): the control plane listens there, and the agents in the namespaces reach it over that
network, as separate hosts would, while the host itself still reaches it. Taking a machine's host-side link down
cuts it off from the control plane and from the other machines (a partition); setting it up heals it.

The parts that decide (names, the subnet, the addresses, the record) are pure functions of their inputs; the
parts that act run iproute2's `ip` and util-linux's `nsenter`.

Names carry a prefix derived from the cluster's home, so two clusters with different homes never touch each
other's namespaces and links. Everything is recorded in `<home>/netns.json` before it is made, so whatever a
crash leaves behind, the next `astraeus up` in that home removes it (`remove_leftovers`).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

IFNAMSIZ = 15  # the kernel's longest interface name (IFNAMSIZ - 1)
POOL = ipaddress.ip_network("10.128.0.0/9")  # where a fleet's /24 is chosen from
SUBNET_PREFIX = 24
MAX_MACHINES = 2 ** (32 - SUBNET_PREFIX) - 3  # network, gateway and broadcast addresses taken
RECORD = "netns.json"
NETNS_DIR = "/var/run/netns"  # where `ip netns add` pins namespaces
NS_LINK = "eth0"  # the machine's side of its veth pair, inside its namespace
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class NetnsError(RuntimeError):
    """A namespace or link could not be made or changed (the message says which `ip` command and why)."""


# ------------------------------------------------------------------------------------------------ deciding


def prefix_for(home: str | os.PathLike) -> str:
    """The prefix of every namespace and link of the cluster whose home is `home` ("ax" + 6 hex digits)."""
    return "ax" + hashlib.sha1(os.path.realpath(home).encode()).hexdigest()[:6]


@dataclass(frozen=True)
class MachineLink:
    """One machine's place on the bridge: its namespace, the host side of its veth pair (on the bridge: down is a
    cut), and its address (on `eth0` in the namespace)."""

    name: str
    netns: str
    host_link: str
    address: str


@dataclass
class Layout:
    """A fleet's bridge, subnet and machines: what `create` makes, `destroy` removes, and netns.json records."""

    prefix: str
    bridge: str
    subnet: str
    gateway: str
    machines: list[MachineLink] = field(default_factory=list)
    owner_pid: int | None = None  # the `astraeus up` that made it

    def machine(self, name: str) -> MachineLink:
        for m in self.machines:
            if m.name == name:
                return m
        raise NetnsError(f"no machine {name!r} in this fleet (machines: {', '.join(m.name for m in self.machines)})")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Layout:
        d = json.loads(text)
        return cls(prefix=d["prefix"], bridge=d["bridge"], subnet=d["subnet"], gateway=d["gateway"],
                   machines=[MachineLink(**m) for m in d.get("machines", [])], owner_pid=d.get("owner_pid"))


def check_machine_name(name: str) -> str:
    if not _NAME.match(name) or len(name) > 64:
        raise ValueError(f"machine name {name!r}: use letters, digits, '-', '_' or '.' (at most 64)")
    return name


def choose_subnet(key: str, taken: Iterable[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """A /24 in 10.128.0.0/9 that overlaps none of `taken` (the host's addresses and routes): the first free one
    from a place derived from `key` (the home), so a cluster gets the same subnet each time when it is free."""
    taken = [t for t in taken if t.prefixlen > 0]  # a default route overlaps everything: not a conflict
    count = 2 ** (SUBNET_PREFIX - POOL.prefixlen)
    start = int(hashlib.sha1(key.encode()).hexdigest(), 16) % count
    base = int(POOL.network_address)
    for k in range(count):
        net = ipaddress.ip_network((base + ((start + k) % count) * 2 ** (32 - SUBNET_PREFIX), SUBNET_PREFIX))
        if not any(net.overlaps(t) for t in taken):
            return net
    raise NetnsError(f"every /{SUBNET_PREFIX} in {POOL} is in use on this host")


def plan(home: str | os.PathLike, machine_names: Sequence[str], taken: Iterable[ipaddress.IPv4Network],
         owner_pid: int | None = None) -> Layout:
    """The layout for a cluster in `home` with these machines, on a subnet none of `taken` overlaps."""
    if len(machine_names) > MAX_MACHINES:
        raise ValueError(f"{len(machine_names)} machines: at most {MAX_MACHINES} with network namespaces")
    if len(set(machine_names)) != len(machine_names):
        raise ValueError("machine names must differ")
    prefix = prefix_for(home)
    net = choose_subnet(os.path.realpath(home), taken)
    hosts = list(net.hosts())
    machines = [MachineLink(name=check_machine_name(n), netns=f"{prefix}-{n}", host_link=f"{prefix}-h{i + 1}",
                            address=str(hosts[i + 1])) for i, n in enumerate(machine_names)]
    lay = Layout(prefix=prefix, bridge=f"{prefix}-br", subnet=str(net), gateway=str(hosts[0]), machines=machines,
                 owner_pid=owner_pid)
    for name in [lay.bridge, *(m.host_link for m in machines)]:
        assert len(name) <= IFNAMSIZ, name
    return lay


def networks_in_use(addr_text: str, route_text: str) -> list[ipaddress.IPv4Network]:
    """The IPv4 networks of the host's addresses (`ip -4 -o addr`) and routes (`ip -4 route`)."""
    out: list[ipaddress.IPv4Network] = []
    for line in addr_text.splitlines():
        parts = line.split()
        if "inet" in parts and parts.index("inet") + 1 < len(parts):
            try:
                out.append(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network)
            except ValueError:
                pass
    for line in route_text.splitlines():
        parts = line.split()
        if not parts or parts[0] == "default":
            continue
        dest = parts[1] if parts[0] in ("unicast", "local", "broadcast", "blackhole", "unreachable",
                                        "prohibit", "throw") and len(parts) > 1 else parts[0]
        try:
            out.append(ipaddress.ip_network(dest, strict=False))
        except ValueError:
            pass
    return out


def link_names(text: str) -> list[str]:
    """Interface names from `ip -o link` ("12: ax…-h1@if11: <…>" → "ax…-h1")."""
    out = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2 and parts[0].strip().isdigit():
            out.append(parts[1].strip().split("@", 1)[0])
    return out


def netns_names(text: str) -> list[str]:
    """Namespace names from `ip netns list` ("name (id: 3)" or "name")."""
    return [line.split()[0] for line in text.splitlines() if line.strip()]


def exec_argv(netns: str, argv: Sequence[str]) -> list[str]:
    """`argv` run inside the namespace `netns`. Through `nsenter --net` rather than `ip netns exec`: the latter
    also remounts /sys in a new mount namespace, which hides /sys/fs/cgroup, and an agent without its cgroups
    cannot enforce its workers' limits. Only the network namespace changes here."""
    return ["nsenter", f"--net={NETNS_DIR}/{netns}", "--", *argv]


# ------------------------------------------------------------------------------------------------ acting


def unavailable() -> str | None:
    """Why network namespaces cannot be made here (one line), or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth pairs and a bridge are made with iproute2 as root)"
    if not shutil.which("ip"):
        return "needs iproute2's `ip` command (apt-get install iproute2)"
    if not shutil.which("nsenter"):
        return "needs util-linux's `nsenter` (apt-get install util-linux)"
    return None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {(p.stderr or p.stdout).strip()}")
    return p


def networks_taken() -> list[ipaddress.IPv4Network]:
    """The networks of this host's IPv4 addresses and routes (other fleets' bridges included)."""
    return networks_in_use(ip("-4", "-o", "addr").stdout, ip("-4", "route").stdout)


def record_path(home: str | os.PathLike) -> Path:
    return Path(home) / RECORD


def load(home: str | os.PathLike) -> Layout | None:
    try:
        return Layout.from_json(record_path(home).read_text())
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return None  # a torn record: the prefix scan in remove_leftovers still finds what was made


def save(home: str | os.PathLike, layout: Layout) -> None:
    path = record_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(layout.to_json())
    os.replace(tmp, path)


def create(layout: Layout) -> None:
    """Make the bridge (with the gateway address), and for each machine its namespace, veth pair and address,
    loopback up. Raises NetnsError (the caller destroys what was made)."""
    net = ipaddress.ip_network(layout.subnet)
    ip("link", "add", layout.bridge, "type", "bridge", "forward_delay", "0", "nf_call_iptables", "0")
    ip("addr", "add", f"{layout.gateway}/{net.prefixlen}", "dev", layout.bridge)
    ip("link", "set", layout.bridge, "up")
    for m in layout.machines:
        ip("netns", "add", m.netns)
        ip("link", "add", m.host_link, "type", "veth", "peer", "name", NS_LINK, "netns", m.netns)
        ip("link", "set", m.host_link, "master", layout.bridge)
        ip("link", "set", m.host_link, "up")
        ip("-n", m.netns, "addr", "add", f"{m.address}/{net.prefixlen}", "dev", NS_LINK)
        ip("-n", m.netns, "link", "set", "lo", "up")
        ip("-n", m.netns, "link", "set", NS_LINK, "up")


def pids_in(netns: str) -> list[int]:
    p = ip("netns", "pids", netns, check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit()] if p.returncode == 0 else []


def kill_all_in(netns: str) -> list[int]:
    """SIGKILL every process in the namespace (what a crashed cluster left running there)."""
    killed = []
    for pid in pids_in(netns):
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    return killed


def destroy(layout: Layout) -> None:
    """Remove every namespace (and the processes still in it), link and the bridge of `layout`; what is already
    gone is skipped, so it may run any number of times."""
    _remove(netns=[m.netns for m in layout.machines],
            links=[m.host_link for m in layout.machines] + [layout.bridge])


def _remove(netns: Iterable[str], links: Iterable[str]) -> None:
    present = set(netns_names(ip("netns", "list", check=False).stdout))
    for ns in netns:
        if ns in present:
            kill_all_in(ns)
            ip("netns", "del", ns, check=False)
    have = set(link_names(ip("-o", "link", check=False).stdout))
    for link in links:
        if link in have:
            ip("link", "del", link, check=False)


def remove_leftovers(home: str | os.PathLike) -> list[str]:
    """Remove what an earlier cluster in `home` made and did not remove (it crashed, or was killed): the
    recorded layout, and every namespace and link with this home's prefix. Returns the names removed."""
    prefix = prefix_for(home) + "-"
    recorded = load(home)
    ns = [n for n in netns_names(ip("netns", "list", check=False).stdout) if n.startswith(prefix)]
    links = [n for n in link_names(ip("-o", "link", check=False).stdout) if n.startswith(prefix)]
    if recorded:
        ns += [m.netns for m in recorded.machines if m.netns not in ns]
        links += [x for x in [*(m.host_link for m in recorded.machines), recorded.bridge] if x not in links]
    present_ns = set(netns_names(ip("netns", "list", check=False).stdout))
    present_links = set(link_names(ip("-o", "link", check=False).stdout))
    found = [n for n in ns if n in present_ns] + [x for x in links if x in present_links]
    # the host-side links first: the bridge last
    _remove(ns, sorted(links, key=lambda x: x.endswith("-br")))
    record_path(home).unlink(missing_ok=True)
    return found


def owner_alive(layout: Layout | None) -> int | None:
    """The pid of the `astraeus up` that made `layout`, if it still runs."""
    pid = layout.owner_pid if layout else None
    if not pid or pid == os.getpid():
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return None
    return pid if any(a.endswith(b"astraeus") or a == b"astraeus.main" for a in argv) and b"up" in argv else None


def set_link(layout: Layout, machine: str, up: bool) -> None:
    ip("link", "set", layout.machine(machine).host_link, "up" if up else "down")


def cut(layout: Layout, machine: str) -> None:
    """Take `machine`'s link down: it reaches neither the control plane nor the other machines."""
    set_link(layout, machine, False)


def heal(layout: Layout, machine: str) -> None:
    set_link(layout, machine, True)


def run_in(netns: str, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
    """Run `argv` inside the namespace and wait for it."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    return subprocess.run(exec_argv(netns, argv), **kw)
