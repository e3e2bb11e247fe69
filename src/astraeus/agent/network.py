"""A network of its own for every worker (issue 42 items 1 and 2): a network namespace per worker, made by the agent
before the worker's supervisor starts, with its own IPv4 address; nothing of the machine is reachable from it.

Routed veth pairs, as Calico does, no bridge: the machine's side `aw<owner tag><key hash>` has no address, a /32
route to the worker's address and proxy_arp; the worker's side is `eth0` in the namespace `astraeus-<owner>-<hash>`
(pinned at /run/netns/<name> by `ip netns add`) with the address /32 and a default route via the link-local
169.254.1.1, whose neighbour entry is the machine side's fixed MAC (so no ARP is needed either way round). Making a
worker's network is two `ip -batch` runs (the machine's side, then the inside) and a /proc write.

Addresses: a worker of a gang that spans machines gets the address the control plane chose; any other worker the
lowest free address of a machine-local pool (free: not routed as a /32 nor the machine's own), chosen under an
flock that every agent on the machine shares, so two agents in one network namespace never pick the same.

One nftables table per agent, `inet astraeus_<owner>` (`ruleset`): nothing from a worker reaches the machine itself
(input hook); a worker reaches another worker only for an address pair in the set `peers` (a gang's pairs, both
directions), and nothing else reaches a worker; egress is the policy's (`Policy`); traffic leaving the machine is
masqueraded, except between gang peers (so a peer machine sees the real source); a worker's source address must
route back through its own interface (no spoofing a peer). Gang peers on other machines are reached through
`ip route replace <peer>/32 via <its machine>`: the machines of a gang share a link (or their network routes the
workers' addresses to them).

Interfaces carry the owner's tag so that two agents sharing one network namespace (`astraeus up --machines 2`)
each police only their own workers: with one `aw*` match, one agent's "nothing else reaches a worker" rule would drop
the other's gang pairs. `remove` deletes the /32 route and unpins the namespace; the kernel destroys the veth pair
with the namespace in the background (an explicit `link del` waits for an RCU grace period).

Each worker's address and peers are recorded under <run_dir>/network/<owner>/<netns>.json, so `remove` knows which
set elements and routes are its own after an agent restart.

The parts that decide (names, address choice, batch texts, ruleset, resolv.conf) are pure functions; the methods
of `WorkerNetworks` read /proc, and run `ip` and `nft`.
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

NETNS_DIR = "/run/netns"
RUN_DIR = "/run/astraeus"
LOCAL_POOL = "100.127.0.0/16"
GATEWAY = "169.254.1.1"  # the worker's next hop: link-local, answered by the machine side's fixed MAC
HOST_MAC = "ee:ee:ee:ee:ee:ee"  # every machine-side veth (Calico's choice: point-to-point links, never clash)
IFNAMSIZ = 15
EGRESS = ("internet", "none", "all")
# What a worker never reaches under the "internet" policy: private, CGNAT, link-local (cloud metadata), loopback,
# multicast, "this network" and reserved.
DEFAULT_BLOCKED = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16",
                   "127.0.0.0/8", "224.0.0.0/4", "0.0.0.0/8", "240.0.0.0/4")
_OWNER_BAD = re.compile(r"[^a-z0-9_]")


class NetworkError(RuntimeError):
    """A worker's network could not be made or changed; the message names the command and what it said."""


@dataclass(frozen=True)
class Peer:
    """A gang mate's worker address, and its machine's address (None when it runs on this machine)."""

    address: str
    via: str | None = None


@dataclass(frozen=True)
class Policy:
    """Egress of workers: "internet" (all but `DEFAULT_BLOCKED` and `blocked`, `allowed` excepted), "none" (gang
    peers only) or "all" (anything but `blocked`). Never the machine itself nor another worker but a gang peer."""

    egress: str = "internet"
    blocked: tuple[str, ...] = ()  # extra addresses/CIDRs (the control plane's resolved addresses)
    allowed: tuple[str, ...] = ()  # admin-given CIDRs reachable despite the blocked ranges


@dataclass(frozen=True)
class WorkerNet:
    name: str  # the netns name
    path: str  # /run/netns/<name>: setns(open(path), CLONE_NEWNET), or OCI {"type": "network", "path": path}
    address: str
    interface: str  # the machine side of the veth pair


# ------------------------------------------------------------------------------------------------ deciding


def sanitize_owner(owner: str) -> str:
    """`owner` as [a-z0-9_] (at most 32: a longer one keeps a hash of the rest)."""
    s = _OWNER_BAD.sub("_", owner.lower()) or "_"
    if len(s) > 32:
        s = s[:23] + "_" + hashlib.sha256(s.encode()).hexdigest()[:8]
    return s


def owner_tag(owner: str) -> str:
    """The machine-side interface prefix of an owner's workers ("aw" + 4 hex): its nft rules match only these,
    so two agents in one network namespace each police their own workers."""
    return "aw" + hashlib.sha256(sanitize_owner(owner).encode()).hexdigest()[:4]


def key_hash(owner: str, key: str) -> str:
    return hashlib.sha256(f"{sanitize_owner(owner)}\0{key}".encode()).hexdigest()[:IFNAMSIZ - 6]


def netns_name(owner: str, key: str) -> str:
    return f"astraeus-{sanitize_owner(owner)}-{key_hash(owner, key)}"


def interface_for(owner: str, netns: str) -> str:
    """The machine side of the worker whose namespace is `netns` (the name's hash after the owner tag)."""
    return owner_tag(owner) + netns.rsplit("-", 1)[1]


def table_name(owner: str) -> str:
    return f"astraeus_{sanitize_owner(owner)}"


def choose_address(pool: str, used: Iterable[str]) -> str:
    """The lowest host address of `pool` not in `used`."""
    net = ipaddress.IPv4Network(pool)
    taken = {int(ipaddress.IPv4Address(a)) for a in used}
    first, last = int(net.network_address), int(net.broadcast_address)
    if net.prefixlen < 31:
        first, last = first + 1, last - 1
    for a in range(first, last + 1):
        if a not in taken:
            return str(ipaddress.IPv4Address(a))
    raise NetworkError(f"no free worker address in {pool} (all {last - first + 1} in use)")


def host_routes(route_text: str) -> dict[str, str]:
    """The /32 routes of /proc/net/route: {address: interface}."""
    out: dict[str, str] = {}
    for line in route_text.splitlines()[1:]:
        f = line.split()
        if len(f) >= 8 and f[7] == "FFFFFFFF":
            out[str(ipaddress.IPv4Address(struct.pack("<I", int(f[1], 16))))] = f[0]
    return out


def default_interface(route_text: str) -> str | None:
    for line in route_text.splitlines()[1:]:
        f = line.split()
        if len(f) >= 8 and f[1] == "00000000" and f[7] == "00000000":
            return f[0]
    return None


def local_addresses(fib_trie_text: str) -> set[str]:
    """The machine's own IPv4 addresses (the "/32 host LOCAL" leaves of /proc/net/fib_trie)."""
    out, last = set(), None
    for line in fib_trie_text.splitlines():
        s = line.strip()
        if s.startswith("|-- "):
            last = s[4:]
        elif last and s.startswith("/32 host LOCAL"):
            out.add(last)
    return out


def pairs(address: str, peers: Iterable[Peer]) -> set[tuple[str, str]]:
    """The `peers` set elements of a worker: both directions with each peer."""
    return {x for p in peers for x in ((address, p.address), (p.address, address))}


def host_batch(netns: str, interface: str, address: str, mtu: int) -> str:
    """`ip -batch` lines for the machine side: the namespace, the veth pair (its peer `eth0` inside), the route."""
    return (f"netns add {netns}\n"
            f"link add {interface} address {HOST_MAC} mtu {mtu} type veth peer name eth0 mtu {mtu} netns {netns}\n"
            f"link set {interface} up\n"
            f"route add {address}/32 dev {interface} scope link\n")


def inside_batch(address: str) -> str:
    """`ip -n <netns> -batch` lines for the worker's side."""
    return ("link set lo up\n"
            f"addr add {address}/32 dev eth0\n"
            "link set eth0 up\n"
            f"route add {GATEWAY} dev eth0 scope link\n"
            f"neigh add {GATEWAY} lladdr {HOST_MAC} dev eth0 nud permanent\n"
            f"route add default via {GATEWAY} dev eth0\n")


def _cidrs(items: Iterable[str]) -> list[str]:
    nets = [ipaddress.IPv4Network(x, strict=False) for x in items]
    return [str(n) for n in ipaddress.collapse_addresses(nets)]


def _elements(items: Iterable[str]) -> str:
    items = list(items)
    return f" elements = {{ {', '.join(items)} }};" if items else ""


def check_policy(policy: Policy) -> Policy:
    if policy.egress not in EGRESS:
        raise ValueError(f"egress {policy.egress!r}: one of {', '.join(EGRESS)}")
    for x in (*policy.blocked, *policy.allowed):
        try:
            ipaddress.IPv4Network(x, strict=False)
        except ValueError as e:
            raise ValueError(f"{x!r} is not an IPv4 address or CIDR: {e}") from None
    return policy


def ruleset(owner: str, policy: Policy, resolvers: Sequence[str] = (),
            peers: Iterable[tuple[str, str]] = ()) -> str:
    """The `nft -f` text that makes (or atomically replaces) the owner's table, keeping the `peers` elements given.
    "all" still blocks the policy's own `blocked` addresses (the control plane's): only the default ranges go."""
    t, w = table_name(owner), owner_tag(owner) + "*"
    blocked = _cidrs(([] if policy.egress == "all" else list(DEFAULT_BLOCKED)) + list(policy.blocked))
    allowed = _cidrs(policy.allowed)
    dns = sorted({str(ipaddress.IPv4Address(r)) for r in resolvers})
    elems = sorted(f"{a} . {b}" for a, b in peers)
    if policy.egress == "none":
        egress = [f'iifname "{w}" drop']
    else:
        egress = [f'iifname "{w}" ip daddr @allowed accept',
                  f'iifname "{w}" ip daddr @resolvers udp dport 53 accept',
                  f'iifname "{w}" ip daddr @resolvers tcp dport 53 accept',
                  f'iifname "{w}" ip daddr @blocked drop']
    rules = "\n".join("    " + r for r in [
        # nothing but IPv4 is routed for workers
        f'iifname "{w}" meta nfproto != ipv4 drop',
        f'oifname "{w}" meta nfproto != ipv4 drop',
        "ct state established,related accept",
        f'iifname "{w}" ip saddr . ip daddr @peers accept',
        f'oifname "{w}" ip saddr . ip daddr @peers accept',
        f'oifname "{w}" drop',  # no other worker, here or elsewhere, reaches a worker
        *egress])
    return (f"add table inet {t}\n"
            f"delete table inet {t}\n"
            f"table inet {t} {{\n"
            f"  set peers {{ type ipv4_addr . ipv4_addr;{_elements(elems)} }}\n"
            f"  set blocked {{ type ipv4_addr; flags interval;{_elements(blocked)} }}\n"
            f"  set allowed {{ type ipv4_addr; flags interval;{_elements(allowed)} }}\n"
            f"  set resolvers {{ type ipv4_addr;{_elements(dns)} }}\n"
            f"  chain prerouting {{\n"
            f"    type filter hook prerouting priority raw; policy accept;\n"
            # a worker's source must route back through its own interface (strict reverse-path check)
            f'    iifname "{w}" meta nfproto ipv4 fib saddr . iif oif missing drop\n'
            f"  }}\n"
            f"  chain input {{\n"
            f"    type filter hook input priority filter; policy accept;\n"
            f'    iifname "{w}" ct state established,related accept\n'  # replies to what the machine opened
            f'    iifname "{w}" drop\n'
            f"  }}\n"
            f"  chain forward {{\n"
            f"    type filter hook forward priority filter; policy accept;\n"
            f"{rules}\n"
            f"  }}\n"
            f"  chain postrouting {{\n"
            f"    type nat hook postrouting priority srcnat; policy accept;\n"
            f'    iifname "{w}" ip saddr . ip daddr != @peers masquerade\n'
            f"  }}\n"
            f"}}\n")


def elements_batch(owner: str, add: Iterable[tuple[str, str]], delete: Iterable[tuple[str, str]]) -> str:
    """`nft -f` lines adding and deleting `peers` elements (one transaction)."""
    t = table_name(owner)
    out = []
    for verb, items in (("add", sorted(add)), ("delete", sorted(delete))):
        if items:
            out.append(f"{verb} element inet {t} peers {{ {', '.join(f'{a} . {b}' for a, b in items)} }}\n")
    return "".join(out)


def nameservers(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 2 and f[0] == "nameserver":
            out.append(f[1])
    return out


def worker_resolv_conf(host_text: str, upstream_text: str | None = None) -> str:
    """A resolv.conf for workers: the host's, without loopback nameservers (systemd-resolved's 127.0.0.53 is the
    machine's, which workers do not reach) nor IPv6 ones (workers have IPv4 only); when that leaves none, the
    nameservers of `upstream_text` (/run/systemd/resolve/resolv.conf), if given."""

    def usable(text: str) -> list[str]:
        out = []
        for s in nameservers(text):
            try:
                a = ipaddress.ip_address(s.split("%")[0])
            except ValueError:
                continue
            if a.version == 4 and not a.is_loopback and not a.is_unspecified and s not in out:
                out.append(s)
        return out

    servers = usable(host_text)
    if not servers and nameservers(host_text) and upstream_text is not None:
        servers = usable(upstream_text)
    keep = [ln for ln in host_text.splitlines() if ln.split()[:1] in (["search"], ["domain"], ["options"])]
    return "".join(f"{ln}\n" for ln in ["# written by astraeus for a worker's network namespace",
                                         *(f"nameserver {s}" for s in servers), *keep])


def worker_resolv_conf_of_host(path: str = "/etc/resolv.conf",
                               upstream: str = "/run/systemd/resolve/resolv.conf") -> str:
    """`worker_resolv_conf` of this machine's files."""
    return worker_resolv_conf(_read(path) or "", _read(upstream))


# ------------------------------------------------------------------------------------------------ acting


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")


def unavailable() -> str | None:
    """Why per-worker networks cannot be made here (one line), or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth pairs and nftables rules are made as root)"
    if not _which("ip"):
        return "needs iproute2's `ip` command (apt-get install iproute2)"
    if not _which("nft"):
        return "needs the `nft` command (apt-get install nftables)"
    if not os.path.exists("/proc/self/ns/net"):
        return "the kernel has no network namespaces"
    return None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _proc_net(name: str) -> str:
    # thread-self: the namespace of the calling thread (a thread that setns'd sees its own)
    return _read(f"/proc/thread-self/net/{name}") or _read(f"/proc/self/net/{name}") or ""


def _write_sysctl(path: str, value: str) -> None:
    try:
        with open(path) as f:
            if f.read().strip() == value:
                return
        with open(path, "w") as f:
            f.write(value)
    except OSError as e:
        raise NetworkError(f"cannot write {value} to {path}: {e.strerror}") from None


def _run(argv: list[str], text_in: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    try:
        p = subprocess.run(argv, input=text_in, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetworkError(f"{' '.join(argv)}: {e}") from None
    if check and p.returncode != 0:
        raise NetworkError(_failure(argv, text_in, p))
    return p


def _failure(argv: list[str], text_in: str | None, p: subprocess.CompletedProcess) -> str:
    """"`ip -batch -` failed (exit 1) at `link add …`: RTNETLINK answers: File exists"."""
    err = " ".join((p.stderr or p.stdout or "").split())
    line = _failed_line(p.stderr)
    at = ""
    if text_in and line:
        lines = text_in.splitlines()
        if 0 < line <= len(lines):
            at = f" at `{lines[line - 1]}`"
    return f"`{' '.join(argv)}` failed (exit {p.returncode}){at}: {err or 'no message'}"


def _failed_line(stderr: str | None) -> int | None:
    m = re.search(r"Command failed -:(\d+)", stderr or "") or re.search(r"/dev/stdin:(\d+):", stderr or "")
    return int(m.group(1)) if m else None


def _interface_exists(name: str) -> bool:
    return os.path.exists(f"/proc/sys/net/ipv4/conf/{name}")  # /proc/sys/net is the caller's namespace


def _interface_mtu(name: str) -> int | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            r = fcntl.ioctl(s, 0x8921, struct.pack("16si", name.encode(), 0))  # SIOCGIFMTU
        return struct.unpack("16si", r)[1]
    except OSError:
        return None


def _ipv4(a: str, what: str) -> str:
    try:
        return str(ipaddress.IPv4Address(a))
    except ValueError:
        raise ValueError(f"{what} {a!r} is not an IPv4 address") from None


@dataclass
class _Record:
    key: str
    address: str
    peers: list[Peer]  # as routed: via None when no route was added for it

    def to_json(self) -> str:
        return json.dumps({"key": self.key, "address": self.address,
                           "peers": [[p.address, p.via] for p in self.peers]})

    @classmethod
    def from_json(cls, text: str) -> _Record:
        d = json.loads(text)
        return cls(key=d["key"], address=d["address"], peers=[Peer(a, v) for a, v in d.get("peers", [])])


class WorkerNetworks:
    """An agent's worker networks on this machine (the caller's network namespace)."""

    def __init__(self, owner: str, policy: Policy = Policy(), local_pool: str = LOCAL_POOL,
                 run_dir: str = RUN_DIR, mtu: int | None = None):
        self.owner = sanitize_owner(owner)
        self.policy = check_policy(policy)
        self.local_pool = str(ipaddress.IPv4Network(local_pool))
        self.run_dir = run_dir
        self.records_dir = os.path.join(run_dir, "network", self.owner)
        self.lock_path = os.path.join(run_dir, "network.lock")
        self.table = table_name(self.owner)
        self.tag = owner_tag(self.owner)
        self._mtu = mtu
        self._mu = threading.RLock()  # this agent's records, set elements and peer routes
        self._cache: dict[str, _Record] | None = None
        self.resolv_conf: str | None = None  # the workers' /etc/resolv.conf, from setup_machine
        self._ip = _which("ip") or "ip"
        self._nft = _which("nft") or "nft"

    # -- the machine

    def setup_machine(self) -> None:
        """Make (or replace atomically) this owner's nftables table, keeping its `peers` elements, and turn on
        IPv4 forwarding. Idempotent."""
        os.makedirs(self.records_dir, exist_ok=True)
        self.resolv_conf = worker_resolv_conf_of_host()  # read once: every worker's /etc/resolv.conf
        resolvers = nameservers(self.resolv_conf)
        with self._mu:
            text = ruleset(self.owner, self.policy, resolvers, self._set_elements())
            _run([self._nft, "-f", "-"], text)
        _write_sysctl("/proc/sys/net/ipv4/ip_forward", "1")

    def close_machine(self) -> None:
        """Delete this owner's table (the agent stops with its workers)."""
        p = _run([self._nft, "delete", "table", "inet", self.table], check=False)
        if p.returncode != 0 and "No such file" not in p.stderr:
            raise NetworkError(_failure([self._nft, "delete", "table", "inet", self.table], None, p))

    # -- workers

    def name_of(self, key: str) -> str:
        return netns_name(self.owner, key)

    def create(self, key: str, address: str | None = None, peers: Sequence[Peer] = ()) -> WorkerNet:
        """Make the worker's namespace, veth pair and routes (with `address`, else one from the local pool), and
        its gang pairs. Raises NetworkError (nothing of it is left) or ValueError."""
        name = self.name_of(key)
        iface = interface_for(self.owner, name)
        if address is not None:
            address = _ipv4(address, "address")
        os.makedirs(self.records_dir, exist_ok=True)
        made = False
        try:
            if address is None:
                with open(self.lock_path, "a") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)  # until the route is in: the address is taken from then on
                    used = set(host_routes(_proc_net("route"))) | local_addresses(_proc_net("fib_trie"))
                    address = choose_address(self.local_pool, used)
                    made = self._make_host_side(key, name, iface, address)
            else:
                made = self._make_host_side(key, name, iface, address)
            _write_sysctl(f"/proc/sys/net/ipv4/conf/{iface}/proxy_arp", "1")
            _run([self._ip, "-n", name, "-batch", "-"], inside_batch(address))
            if peers:
                self.set_peers(key, address, peers)
        except BaseException:
            if made:
                try:
                    self.discard(name)
                except NetworkError:
                    pass
            raise
        return WorkerNet(name=name, path=f"{NETNS_DIR}/{name}", address=address, interface=iface)

    def _make_host_side(self, key: str, name: str, iface: str, address: str) -> bool:
        """Record the worker, then run the machine-side batch. True when something of it may exist (the caller
        removes it on a later failure); raises with nothing left when the namespace or record already exists."""
        rec = self._record_path(name)
        with self._mu:
            try:
                with open(rec, "x") as f:
                    f.write(_Record(key, address, []).to_json())
            except FileExistsError:
                raise NetworkError(f"worker network {name} exists already (key {key!r})") from None
            self._cached()[name] = _Record(key, address, [])
        batch = host_batch(name, iface, address, self.mtu())
        # the same key's earlier veth, whose namespace is unpinned but held by a process, or not yet destroyed
        stale = _interface_exists(iface)
        if stale:
            batch = f"link del {iface}\n" + batch
        p = _run([self._ip, "-batch", "-"], batch, check=False)
        if p.returncode == 0:
            return True
        line = _failed_line(p.stderr)
        msg = _failure([self._ip, "-batch", "-"], batch, p)
        line = None if line is None else line - stale  # as numbered in host_batch
        if line is not None and line <= 2:  # no veth pair (the name may be another's): only our netns to remove
            if line == 2:
                _run([self._ip, "netns", "del", name], check=False)
            with self._mu:
                os.unlink(rec)
                self._cached().pop(name, None)
            raise NetworkError(msg)
        self.discard(name)
        raise NetworkError(msg)

    def set_peers(self, key: str, address: str, peers: Sequence[Peer]) -> None:
        """Make the worker's gang pairs exactly `peers` (both directions), with a route to each peer on another
        machine through that machine's address."""
        name = self.name_of(key)
        address = _ipv4(address, "address")
        peers = [Peer(_ipv4(p.address, "peer address"), None if p.via is None else _ipv4(p.via, "peer via"))
                 for p in peers]
        with self._mu:
            rec = self._load(name)
            if rec is None:
                raise NetworkError(f"no worker network for {key!r}")
            if rec.address != address:
                raise NetworkError(f"worker network {name} has address {rec.address}, not {address}")
            mine = set(local_addresses(_proc_net("fib_trie"))) if any(p.via for p in peers) else set()
            routed = host_routes(_proc_net("route"))
            new = []
            for p in peers:
                remote = p.via is not None and p.via not in mine and not ipaddress.IPv4Address(p.via).is_loopback
                if remote and routed.get(p.address, "").startswith("aw"):
                    raise NetworkError(f"peer {p.address} via {p.via}: that address is a worker's on this machine "
                                       f"({routed[p.address]}); gang addresses must not come from a local pool")
                new.append(Peer(p.address, p.via if remote else None))
            others = [r for n, r in self._records() if n != name]
            old_pairs, new_pairs = pairs(address, rec.peers), pairs(address, new)
            needed = {p.address for r in others for p in r.peers if p.via} | {p.address for p in new if p.via}
            lines = [f"route replace {p.address}/32 via {p.via}" for p in new if p.via]
            lines += [f"route del {p.address}/32 via {p.via}" for p in rec.peers
                      if p.via and p.address not in needed]
            if lines:
                _run([self._ip, "-batch", "-"], "".join(x + "\n" for x in lines))
            self._update_elements(new_pairs, old_pairs - new_pairs)
            rec.peers = new
            self._save(name, rec)

    def remove(self, key: str) -> None:
        """Remove the worker's network: its pairs in `peers`, its namespace and veth pair (with its route), and its
        peer routes no other worker of this agent needs. Idempotent."""
        self.discard(self.name_of(key))

    def discard(self, name: str) -> None:
        """`remove` by namespace name (one of `existing()`)."""
        iface = interface_for(self.owner, name)
        with self._mu:
            rec = self._load(name)
            address = rec.address if rec else next(
                (a for a, i in host_routes(_proc_net("route")).items() if i == iface), None)
            others = [r for n, r in self._records() if n != name]
            if address:
                gone = pairs(address, rec.peers) if rec else set()
                gone |= {x for r in others for x in pairs(r.address, r.peers) if address in x}
                if gone or rec is None:  # without a record: whatever the set holds for the address
                    self._update_elements(set(), gone, address_gone=None if rec else address)
            # The route first: a process still in the namespace is cut off (its source no longer routes back, so
            # the prerouting check drops it) and the address is free. Unpinned, the namespace is destroyed by the
            # kernel in the background with its veth pair (`link del` would wait for an RCU grace period).
            lines = [f"route del {address}/32 dev {iface}"] if address else []
            if os.path.exists(f"{NETNS_DIR}/{name}"):
                lines.append(f"netns del {name}")
            needed = {p.address for r in others for p in r.peers if p.via}
            lines += [f"route del {p.address}/32 via {p.via}" for p in (rec.peers if rec else [])
                      if p.via and p.address not in needed]
            if lines:
                p = _run([self._ip, "-force", "-batch", "-"], "".join(x + "\n" for x in lines), check=False)
                if p.returncode != 0 and os.path.exists(f"{NETNS_DIR}/{name}"):
                    raise NetworkError(_failure([self._ip, "-force", "-batch", "-"], None, p))
            try:
                os.unlink(self._record_path(name))
            except FileNotFoundError:
                pass
            self._cached().pop(name, None)

    def existing(self) -> list[str]:
        """The netns names of this owner's workers (pinned, or recorded and not yet removed)."""
        pat = re.compile(rf"^astraeus-{re.escape(self.owner)}-[0-9a-f]{{{IFNAMSIZ - 6}}}$")
        names = set()
        for d, suffix in ((NETNS_DIR, ""), (self.records_dir, ".json")):
            try:
                entries = os.listdir(d)
            except OSError:
                continue
            names |= {e[:len(e) - len(suffix)] for e in entries if e.endswith(suffix)
                      and pat.match(e[:len(e) - len(suffix)])}
        return sorted(names)

    def mtu(self) -> int:
        """The veth MTU: the constructor's, else the default route's interface's (1500 without one)."""
        if self._mtu is None:
            dev = default_interface(_proc_net("route"))
            self._mtu = (_interface_mtu(dev) if dev else None) or 1500
        return self._mtu

    # -- records and set elements

    def _record_path(self, name: str) -> str:
        return os.path.join(self.records_dir, name + ".json")

    def _cached(self) -> dict[str, _Record]:
        """The records of this owner, read from disk once (this object keeps them in step after that)."""
        with self._mu:
            if self._cache is None:
                self._cache = self._read_records()
            return self._cache

    def _read_records(self) -> dict[str, _Record]:
        cache = {}
        try:
            entries = os.listdir(self.records_dir)
        except OSError:
            entries = []
        for e in entries:
            text = _read(os.path.join(self.records_dir, e)) if e.endswith(".json") else None
            try:
                if text:
                    cache[e[:-5]] = _Record.from_json(text)
            except (ValueError, KeyError, TypeError):
                pass  # a torn record: `discard` finds the address from the route
        return cache

    def _load(self, name: str) -> _Record | None:
        return self._cached().get(name)

    def _save(self, name: str, rec: _Record) -> None:
        tmp = self._record_path(name) + ".tmp"
        with open(tmp, "w") as f:
            f.write(rec.to_json())
        os.replace(tmp, self._record_path(name))
        self._cached()[name] = rec

    def _records(self) -> list[tuple[str, _Record]]:
        return list(self._cached().items())

    def _set_elements(self) -> set[tuple[str, str]]:
        """The `peers` elements in the table now (none when there is no table)."""
        p = _run([self._nft, "-j", "list", "set", "inet", self.table, "peers"], check=False)
        if p.returncode != 0:
            if "No such file" in p.stderr:
                return set()
            raise NetworkError(_failure([self._nft, "-j", "list", "set", "inet", self.table, "peers"], None, p))
        out = set()
        for item in json.loads(p.stdout).get("nftables", []):
            for e in item.get("set", {}).get("elem", []):
                c = e.get("concat") if isinstance(e, dict) else None
                if c is None and isinstance(e, dict):  # {"elem": {"val": {"concat": …}}} with timeouts/comments
                    c = e.get("elem", {}).get("val", {}).get("concat")
                if c and len(c) == 2:
                    out.add((c[0], c[1]))
        return out

    def _update_elements(self, add: set[tuple[str, str]], delete: set[tuple[str, str]],
                         address_gone: str | None = None) -> None:
        """Add and delete `peers` elements; a delete of an element already gone is not an error. With
        `address_gone`, also delete every element with that address."""
        if address_gone is not None:
            present = self._set_elements()
            delete = {x for x in present if address_gone in x} | (delete & present)
        text = elements_batch(self.owner, add, delete)
        if not text:
            return
        p = _run([self._nft, "-f", "-"], text, check=False)
        if p.returncode == 0:
            return
        if "No such file" not in p.stderr:
            raise NetworkError(_failure([self._nft, "-f", "-"], text, p))
        present = self._set_elements()  # another removal raced us, or no table yet
        text = elements_batch(self.owner, add, delete & present)
        if text and (add or delete & present):
            _run([self._nft, "-f", "-"], text)


__all__ = ["NetworkError", "Peer", "Policy", "WorkerNet", "WorkerNetworks", "check_policy", "choose_address",
           "elements_batch", "host_batch", "host_routes", "inside_batch", "local_addresses", "nameservers",
           "netns_name", "owner_tag", "pairs", "ruleset", "sanitize_owner", "unavailable", "worker_resolv_conf",
           "worker_resolv_conf_of_host"]
