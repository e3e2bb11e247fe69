"""Images pulled from registries into a content-addressed cache on the machine (stdlib only: the shim imports it).

Tools: `skopeo` (the OCI distribution protocol: resolve, authenticate, copy blobs) and `umoci` (unpack layers into
a root filesystem, garbage-collect the layout). The cache folder `root/`:

  oci/                   one OCI image layout, blobs shared by every image; each cached image is tagged there by
                         its manifest digest's hex (the tag points at the manifest as stored: skopeo writes OCI
                         manifests, so a Docker manifest is stored converted)
  rootfs/<hex>           the image's root filesystem, fully unpacked, root-owned, never written after the unpack
                         (the container runtime uses it as the overlay's lower dir)
  records/<hex>.json     the image: reference first pulled as, digest, its blobs and sizes, rootfs size; the
                         file's mtime is the image's last use (a pull or an acquire)
  aliases/<hex>          an index (multi-arch) digest → the machine's platform manifest digest, so a reference
                         pinned to an index digest is found cached without asking the registry
  holders/<hex>/<holder> one empty file per worker attempt using the image: never evicted while any exists
  locks/<hex>, locks/store   flock files: one pull per digest across processes; the layout's index and the
                         eviction under `store`
  tmp/                   pulls in progress (their own small OCI layout, blobs hardlinked into oci/ at the end;
                         so pulls of different images run at once); what a killed pull left is swept by evict()

`<hex>` is always the hex of the registry's manifest digest (`Image.digest` is "sha256:<hex>"): the digest the
registry and `skopeo inspect` show, and that a user pins with `@sha256:`.

A pull is: resolve the reference to a manifest digest with the registry (one manifest request, made with the
run's own credentials, or anonymously — never with the machine's: so a private image cached by one workspace is
not given to another that the registry refuses; a reference pinned by digest to an image pulled anonymously needs
no registry at all; a multi-arch index gives the machine's linux/<arch> manifest), lock that digest, and if the
image is cached return it (no blob is fetched again); otherwise copy it with `skopeo copy` into a private layout that already holds (hardlinks) the
blobs the cache has, unpack it with `umoci raw unpack` into tmp/ and rename it into rootfs/, then move its blobs
into oci/ and write its record (the record is written last: no record, no image). Credentials go to skopeo in a
0600 auth file outside the cache (in /dev/shm), deleted as soon as skopeo is done: never in argv, an environment variable, a
log line or an exception message.

What decides (`plan_eviction`, `classify_skopeo_error`, `pick_platform`) is pure; `ImageCache` acts.
"""

from __future__ import annotations

import base64
import errno
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from astraeus.imageref import ImageRef

INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")
CREDENTIALS_HINT = "astraeus registries set {registry} --username USER --password-stdin"
_HOLDER = re.compile(r"^[A-Za-z0-9_.:@+=-]{1,255}$")
_HEX = re.compile(r"^[0-9a-f]{64}$")


class PullError(Exception):
    """str(e) is the reason a user reads in the worker's state (it names the image as the user wrote it)."""


@dataclass
class ImageConfig:
    env: list[str] = field(default_factory=list)
    working_dir: str = ""
    user: str = ""
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None

    @classmethod
    def from_oci(cls, config: dict) -> ImageConfig:
        """From an OCI (or Docker) image configuration's JSON: its "config" object."""
        c = config.get("config") or {}
        return cls(env=list(c.get("Env") or []), working_dir=c.get("WorkingDir") or "", user=c.get("User") or "",
                   entrypoint=list(c["Entrypoint"]) if c.get("Entrypoint") is not None else None,
                   cmd=list(c["Cmd"]) if c.get("Cmd") is not None else None)


@dataclass
class Image:
    ref: str  # the reference as first pulled
    digest: str  # "sha256:<hex>", the registry's manifest digest
    rootfs: str  # read-only, fully unpacked root filesystem
    config: ImageConfig
    size: int  # bytes on disk: rootfs + the image's blobs


# ---------------------------------------------------------------- pure: what to do

def machine_arch(machine: str | None = None) -> str:
    """The OCI architecture name of this machine (x86_64 → amd64)."""
    m = (machine or platform.machine()).lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le",
            "s390x": "s390x", "riscv64": "riscv64", "i686": "386", "i386": "386"}.get(m, m)


def pick_platform(index: dict, arch: str, os_name: str = "linux") -> str | None:
    """The digest of the manifest for os_name/arch in a multi-arch index, or None when it has none."""
    for m in index.get("manifests") or []:
        p = m.get("platform") or {}
        if p.get("os") == os_name and p.get("architecture") == arch and m.get("mediaType") not in INDEX_TYPES:
            return m.get("digest")
    return None


def platforms_of(index: dict) -> list[str]:
    out = []
    for m in index.get("manifests") or []:
        p = m.get("platform") or {}
        if p.get("os") and p.get("architecture"):
            out.append(f"{p['os']}/{p['architecture']}" + (f"/{p['variant']}" if p.get("variant") else ""))
    return out


def _skopeo_message(stderr: str) -> str:
    """The useful part of skopeo's error (its last `msg="…"`, or its last line)."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    if not lines:
        return "no error output"
    last = lines[-1]
    m = re.search(r'msg="((?:[^"\\]|\\.)*)"', last)
    msg = m.group(1).replace('\\"', '"') if m else last
    return msg.strip()


def classify_skopeo_error(image: str, registry: str, stderr: str, had_credentials: bool) -> str:
    """The reason a user reads for skopeo's failure to read `image` (as the user wrote it) from `registry`."""
    msg = _skopeo_message(stderr)
    low = msg.lower()
    if "server gave http response to https client" in low:
        return (f"image {image}: registry {registry} speaks plain HTTP; list it in ASTRAEUS_INSECURE_REGISTRIES "
                "on the machine's agent (comma-separated host:port) to pull from it")
    if "unauthorized" in low or "authentication required" in low or "denied" in low or "403 forbidden" in low:
        if had_credentials:
            return (f"image {image}: unauthorized: the workspace's credentials for {registry} were refused "
                    f"(set them with `{CREDENTIALS_HINT.format(registry=registry)}`)")
        return (f"image {image}: unauthorized: no credentials for {registry} in the run's workspace (set them "
                f"with `{CREDENTIALS_HINT.format(registry=registry)}`), or the image does not exist there")
    if "manifest unknown" in low or "name unknown" in low or ("not found" in low and "no such host" not in low):
        return f"image {image} not found: {registry} has no such repository, tag or digest (check the name)"
    if "toomanyrequests" in low or "too many requests" in low:
        return f"image {image}: registry {registry} refused: too many requests (rate limited); it will be retried"
    m = re.search(r"(connection refused|no such host|no route to host|network is unreachable|"
                  r"context deadline exceeded|i/o timeout|connection reset by peer|timeout|eof)", low)
    if m:
        why = {"context deadline exceeded": "no answer in time", "i/o timeout": "no answer in time",
               "timeout": "no answer in time", "eof": "connection closed"}.get(m.group(1), m.group(1))
        return f"image {image}: registry {registry} unreachable ({why})"
    if "x509" in low or "certificate" in low or "tls:" in low:
        return (f"image {image}: registry {registry}'s TLS certificate is not trusted ({msg}); install its CA on "
                "the machine, or list it in ASTRAEUS_INSECURE_REGISTRIES")
    if "no space left" in low:
        return f"image {image}: no space left on the machine's image cache disk"
    return f"image {image}: pull failed: {msg}"


@dataclass(frozen=True)
class CachedImage:
    """What eviction needs to know of a cached image."""
    hex: str
    last_used: float
    rootfs_bytes: int
    blobs: dict[str, int]  # blob hex → size
    held: bool = False


def cache_bytes(images: Iterable[CachedImage]) -> int:
    """Bytes the cache holds: every rootfs, and each blob once however many images share it."""
    blobs: dict[str, int] = {}
    total = 0
    for im in images:
        total += im.rootfs_bytes
        blobs.update(im.blobs)
    return total + sum(blobs.values())


def plan_eviction(images: Iterable[CachedImage], max_bytes: int, keep: Iterable[str] = ()) -> list[str]:
    """The images (hex) to remove, least recently used first, until the cache is within max_bytes. Never one
    held, never one in `keep`. max_bytes 0: no limit."""
    images = list(images)
    if max_bytes <= 0:
        return []
    keep = set(keep)
    remaining = {im.hex: im for im in images}
    out = []
    for im in sorted(images, key=lambda i: (i.last_used, i.hex)):
        if cache_bytes(remaining.values()) <= max_bytes:
            break
        if im.held or im.hex in keep:
            continue
        out.append(im.hex)
        del remaining[im.hex]
    return out


def _hex_of(digest: str) -> str:
    d = digest.split(":", 1)[1] if digest.startswith("sha256:") else digest
    if not _HEX.match(d):
        raise ValueError(f"{digest!r} is not a sha256 digest (sha256: and 64 lowercase hex digits)")
    return d


def _check_holder(holder: str) -> str:
    if not _HOLDER.match(holder or "") or holder in (".", ".."):
        raise ValueError(f"holder {holder!r}: use 1-255 letters, digits and . _ - : @ + =")
    return holder


# ---------------------------------------------------------------- acting

class ImageCache:
    def __init__(self, root: str, max_bytes: int = 0, insecure: Iterable[str] = (), *,
                 resolve_timeout: float = 60.0, pull_timeout: float | None = 3600.0):
        """root: the cache folder (made). max_bytes: the size limit (0: none), enforced after each pull and by
        evict(). insecure: registries (host:port) reached over plain HTTP or TLS without verification.
        resolve_timeout: seconds to resolve a reference (a hung registry fails the pull after it);
        pull_timeout: seconds for the whole copy of an image's blobs."""
        if max_bytes < 0:
            raise ValueError(f"max_bytes {max_bytes}: give 0 (no limit) or a positive size")
        self.root = os.path.abspath(root)
        self.max_bytes = int(max_bytes)
        self.insecure = {h.strip() for h in insecure if h and h.strip()}
        self.resolve_timeout = resolve_timeout
        self.pull_timeout = pull_timeout
        self.layout = os.path.join(self.root, "oci")
        for sub in ("rootfs", "records", "aliases", "holders", "locks", "tmp"):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        os.chmod(self.root, 0o711)
        os.chmod(os.path.join(self.root, "tmp"), 0o700)
        if not os.path.exists(os.path.join(self.layout, "index.json")):
            with self._lock("store"):
                if not os.path.exists(os.path.join(self.layout, "index.json")):
                    _init_layout(self.layout)

    # ---- paths and locks

    def _rootfs(self, hex_: str) -> str:
        return os.path.join(self.root, "rootfs", hex_)

    def _record_path(self, hex_: str) -> str:
        return os.path.join(self.root, "records", hex_ + ".json")

    def _holders(self, hex_: str) -> str:
        return os.path.join(self.root, "holders", hex_)

    @contextmanager
    def _lock(self, name: str, blocking: bool = True) -> Iterator[bool]:
        fd = os.open(os.path.join(self.root, "locks", name), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    # ---- reading what is cached

    def _record(self, hex_: str) -> dict | None:
        try:
            with open(self._record_path(hex_)) as f:
                return json.load(f)
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def _image(self, hex_: str, rec: dict, ref: str | None = None) -> Image:
        with open(os.path.join(self.layout, "blobs", "sha256", _hex_of(rec["config"]))) as f:
            config = ImageConfig.from_oci(json.load(f))
        return Image(ref=ref or rec["ref"], digest="sha256:" + hex_, rootfs=self._rootfs(hex_), config=config,
                     size=int(rec["rootfs_bytes"]) + sum(rec["blobs"].values()))

    def get(self, digest: str) -> Image | None:
        """The cached image with this manifest digest, or None."""
        hex_ = _hex_of(digest)
        rec = self._record(hex_)
        return self._image(hex_, rec) if rec and os.path.isdir(self._rootfs(hex_)) else None

    def cached(self) -> list[CachedImage]:
        out = []
        for name in sorted(os.listdir(os.path.join(self.root, "records"))):
            if not name.endswith(".json"):
                continue
            hex_ = name[:-5]
            rec = self._record(hex_)
            if rec is None:
                continue
            try:
                last = os.stat(self._record_path(hex_)).st_mtime
            except FileNotFoundError:
                continue
            out.append(CachedImage(hex_, last, int(rec["rootfs_bytes"]), dict(rec["blobs"]),
                                   held=bool(self.holders("sha256:" + hex_))))
        return out

    def holders(self, digest: str) -> list[str]:
        try:
            return sorted(os.listdir(self._holders(_hex_of(digest))))
        except FileNotFoundError:
            return []

    def total_bytes(self) -> int:
        return cache_bytes(self.cached())

    # ---- pulling

    def pull(self, ref: str, auth: dict | None = None, *, holder: str | None = None) -> Image:
        """The image `ref` names, pulled if it is not cached. auth: {"username", "password"} for its registry.
        holder: acquire the image for this holder before returning (so no eviction can come between).
        Raises PullError with the reason a user reads."""
        text = (ref or "").strip()
        try:
            parsed = ImageRef.parse(text)
        except ValueError as e:
            raise PullError(str(e)) from None
        if holder is not None:
            _check_holder(holder)
        creds = _credentials(auth)
        try:
            return self._pull(text, parsed, creds, holder)
        except PullError as e:
            msg = str(e)
            if creds and creds[1] in msg:  # never show a password, whatever a tool printed
                raise PullError(msg.replace(creds[1], "***")) from None
            raise

    def _pull(self, text: str, parsed: ImageRef, creds: tuple[str, str] | None, holder: str | None) -> Image:
        with _AuthFile(parsed.registry, creds) as authfile:
            hex_ = self._local_digest(parsed)
            manifest = None
            if hex_ is None:
                hex_, manifest = self._resolve(text, parsed, authfile, creds is not None)
            with self._lock(hex_):
                rec = self._record(hex_)
                if rec is not None and os.path.isdir(self._rootfs(hex_)):
                    self._touch(hex_)
                    if holder is not None:
                        self._acquire_locked(hex_, holder)
                    return self._image(hex_, rec, text)
                if manifest is None:  # evicted since we looked: ask the registry (same digest: it is pinned)
                    hex_, manifest = self._resolve(text, parsed, authfile, creds is not None)
                image = self._fetch(text, parsed, hex_, manifest, authfile, creds is not None)
                if holder is not None:
                    self._acquire_locked(hex_, holder)
        if self.max_bytes:
            self.evict(keep=[hex_])
        return image

    def _local_digest(self, parsed: ImageRef) -> str | None:
        """The platform manifest's hex for a reference pinned by digest, when the cache has that image and it was
        pulled without credentials (no network: its content is public and fixed by the digest). An image pulled
        with credentials is always asked of the registry again (a manifest, never its blobs) with the run's own
        credentials, so no workspace uses a private image another workspace's credentials fetched."""
        if not parsed.digest:
            return None
        hex_ = _hex_of(parsed.digest)
        try:
            with open(os.path.join(self.root, "aliases", hex_)) as f:
                hex_ = f.read().strip()
        except FileNotFoundError:
            pass
        rec = self._record(hex_)
        return hex_ if rec is not None and rec.get("anonymous") and os.path.isdir(self._rootfs(hex_)) else None

    def _skopeo(self, image: str, parsed: ImageRef, args: list[str], timeout: float | None,
                authfile: str | None, had_creds: bool, copy: bool = False) -> bytes:
        # The run's credentials, or none at all: never the machine's own (skopeo's default auth files).
        if authfile:
            creds = ["--src-authfile" if copy else "--authfile", authfile]
        else:
            creds = ["--src-no-creds" if copy else "--no-creds"]
        cmd = ["skopeo", args[0], *creds, *args[1:]]
        try:
            p = subprocess.run(cmd, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise PullError(f"image {image}: registry {parsed.registry} unreachable (no answer in "
                            f"{timeout:g} s)") from None
        except FileNotFoundError:
            raise PullError("skopeo is not installed on the machine (apt-get install skopeo)") from None
        if p.returncode != 0:
            raise PullError(classify_skopeo_error(image, parsed.registry, p.stderr.decode(errors="replace"),
                                                  had_creds))
        return p.stdout

    def _tls(self, parsed: ImageRef, flag: str) -> list[str]:
        return [f"{flag}=false"] if parsed.registry in self.insecure else []

    def _inspect_raw(self, image: str, parsed: ImageRef, transport: str, authfile: str | None,
                     had_creds: bool) -> tuple[str, dict]:
        t = max(1, int(self.resolve_timeout))
        raw = self._skopeo(image, parsed, ["inspect", "--raw", f"--command-timeout={t}s",
                                           *self._tls(parsed, "--tls-verify"), transport],
                           self.resolve_timeout + 10, authfile, had_creds)
        try:
            doc = json.loads(raw)
        except ValueError:
            raise PullError(f"image {image}: the registry {parsed.registry} sent a manifest that is not JSON") from None
        return hashlib.sha256(raw).hexdigest(), doc

    def _resolve(self, image: str, parsed: ImageRef, authfile: str | None, had_creds: bool) -> tuple[str, dict]:
        """(the machine's platform manifest hex, that manifest) for the reference."""
        hex_, doc = self._inspect_raw(image, parsed, parsed.transport, authfile, had_creds)
        if parsed.digest and hex_ != _hex_of(parsed.digest):
            raise PullError(f"image {image}: the registry {parsed.registry} sent a manifest whose digest is "
                            f"sha256:{hex_}, not the one pinned")
        if doc.get("mediaType") in INDEX_TYPES or ("manifests" in doc and "layers" not in doc):
            arch = machine_arch()
            chosen = pick_platform(doc, arch)
            if chosen is None:
                have = ", ".join(platforms_of(doc)) or "none"
                raise PullError(f"image {image} has no linux/{arch} variant (it has: {have}); use an image built "
                                f"for linux/{arch}")
            index_hex = hex_
            hex_, doc = self._inspect_raw(image, parsed, f"docker://{parsed.name}@{chosen}", authfile, had_creds)
            if hex_ != _hex_of(chosen):
                raise PullError(f"image {image}: the registry sent a manifest whose digest is sha256:{hex_}, not "
                                f"{chosen} its index names")
            _write_atomic(os.path.join(self.root, "aliases", index_hex), hex_.encode())
        if int(doc.get("schemaVersion") or 0) != 2 or "layers" not in doc:
            raise PullError(f"image {image}: its manifest is not an OCI or Docker v2 image manifest (schema 1 "
                            "images are not supported: push it again with a current tool)")
        return hex_, doc

    def _fetch(self, image: str, parsed: ImageRef, hex_: str, manifest: dict, authfile: str | None,
               had_creds: bool) -> Image:
        """Copy and unpack the image (its digest lock held)."""
        store = os.path.join(self.layout, "blobs", "sha256")
        stale = self._rootfs(hex_)
        if os.path.lexists(stale):  # a pull that died before its record: start over
            _remove_tree(stale, os.path.join(self.root, "tmp"))
        tmp = os.path.join(self.root, "tmp")
        for name in os.listdir(tmp):  # a pull of this digest that died (we hold its lock: none is running)
            if name.startswith(f"pull-{hex_}-"):
                shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
        work = tempfile.mkdtemp(prefix=f"pull-{hex_}-", dir=tmp)
        try:
            staging = os.path.join(work, "oci")
            _init_layout(staging)
            wanted = [d["digest"] for d in [manifest.get("config") or {}, *manifest["layers"]] if d.get("digest")]
            with self._lock("store"):  # blobs the cache has: skopeo skips them
                for d in wanted:
                    try:
                        b = _hex_of(d)
                    except ValueError:
                        continue
                    try:
                        os.link(os.path.join(store, b), os.path.join(staging, "blobs", "sha256", b))
                    except (FileNotFoundError, FileExistsError):
                        pass
            self._skopeo(image, parsed, ["copy", "--quiet", "--retry-times=2", *self._tls(parsed, "--src-tls-verify"),
                                         f"docker://{parsed.name}@sha256:{hex_}", f"oci:{staging}:{hex_}"],
                         self.pull_timeout, authfile, had_creds, copy=True)
            with open(os.path.join(staging, "index.json")) as f:
                desc = next((m for m in json.load(f)["manifests"]
                             if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") == hex_), None)
            if desc is None:
                raise PullError(f"image {image}: skopeo copied it but its layout has no manifest tagged {hex_}")
            blobs_dir = os.path.join(staging, "blobs", "sha256")
            with open(os.path.join(blobs_dir, _hex_of(desc["digest"]))) as f:
                stored = json.load(f)
            blobs = {_hex_of(d["digest"]): int(d["size"]) for d in [desc, stored["config"], *stored["layers"]]}
            rootfs_tmp = os.path.join(work, "rootfs")
            rootless = ["--rootless"] if os.geteuid() != 0 else []
            p = subprocess.run(["umoci", "raw", "unpack", *rootless, "--image", f"{staging}:{hex_}", rootfs_tmp],
                               capture_output=True, stdin=subprocess.DEVNULL)
            if p.returncode != 0:
                err = p.stderr.decode(errors="replace").strip().splitlines()
                raise PullError(f"image {image}: its layers could not be unpacked ("
                                f"{err[-1] if err else 'umoci failed'})")
            rootfs_bytes = _tree_bytes(rootfs_tmp)
            os.rename(rootfs_tmp, self._rootfs(hex_))
            with self._lock("store"):
                for b in blobs:
                    try:
                        os.link(os.path.join(blobs_dir, b), os.path.join(store, b))
                    except FileExistsError:
                        pass
                _index_set(self.layout, hex_, desc)
                rec = {"ref": image, "name": parsed.name, "digest": "sha256:" + hex_,
                       "oci_manifest": desc["digest"], "config": stored["config"]["digest"],
                       "blobs": blobs, "rootfs_bytes": rootfs_bytes, "pulled_at": time.time(),
                       "anonymous": not had_creds}
                _write_atomic(self._record_path(hex_), json.dumps(rec, indent=1).encode())
            return self._image(hex_, rec)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise PullError(f"image {image}: no space left on the machine's image cache disk "
                                f"({self.root})") from None
            raise PullError(f"image {image}: the image cache {self.root} could not store it "
                            f"({e.strerror or e})") from None
        finally:
            _remove_tree(work, os.path.join(self.root, "tmp"))

    def _touch(self, hex_: str) -> None:
        try:
            os.utime(self._record_path(hex_))
        except FileNotFoundError:
            pass

    # ---- holders and eviction

    def _acquire_locked(self, hex_: str, holder: str) -> None:
        if self._record(hex_) is None:
            raise PullError(f"image sha256:{hex_} is not in the image cache (pull it first)")
        os.makedirs(self._holders(hex_), exist_ok=True)
        with open(os.path.join(self._holders(hex_), holder), "w"):
            pass
        self._touch(hex_)

    def acquire(self, digest: str, holder: str) -> None:
        """`holder` (a worker attempt) uses the image: it is not evicted until released."""
        hex_ = _hex_of(digest)
        _check_holder(holder)
        with self._lock(hex_):
            self._acquire_locked(hex_, holder)

    def release(self, digest: str, holder: str) -> None:
        """`holder` no longer uses the image (it becomes evictable when no holder is left). Idempotent."""
        hex_ = _hex_of(digest)
        _check_holder(holder)
        with self._lock(hex_):
            try:
                os.unlink(os.path.join(self._holders(hex_), holder))
            except FileNotFoundError:
                return
            self._touch(hex_)
            try:
                os.rmdir(self._holders(hex_))
            except OSError:
                pass

    def prune_holders(self, live: Iterable[str]) -> list[tuple[str, str]]:
        """Release every holder not in `live` (the worker attempts that still exist, e.g. after the agent or the
        machine restarted and some never released). Returns the (digest, holder) pairs released."""
        live = set(live)
        out = []
        for hex_ in sorted(os.listdir(os.path.join(self.root, "holders"))):
            if not _HEX.match(hex_):
                continue
            for holder in self.holders("sha256:" + hex_):
                if holder not in live:
                    self.release("sha256:" + hex_, holder)
                    out.append(("sha256:" + hex_, holder))
        return out

    def _sweep(self) -> bool:
        """Remove what died pulls and evictions left (the store lock held): in tmp/, a pull's folder whose digest
        no one is pulling, a folder being removed by a process that is gone; a rootfs or a layout tag with no
        record (a pull killed before its record). True when the layout needs garbage-collecting."""
        gc = False
        for hex_ in os.listdir(os.path.join(self.root, "rootfs")):
            if _HEX.match(hex_) and self._record(hex_) is None:
                with self._lock(hex_, blocking=False) as got:
                    if got and self._record(hex_) is None:
                        _remove_tree(self._rootfs(hex_), os.path.join(self.root, "tmp"))
        with open(os.path.join(self.layout, "index.json")) as f:
            tags = [(m.get("annotations") or {}).get("org.opencontainers.image.ref.name", "")
                    for m in json.load(f).get("manifests") or []]
        for hex_ in tags:
            if _HEX.match(hex_) and self._record(hex_) is None:
                with self._lock(hex_, blocking=False) as got:
                    if got and self._record(hex_) is None:
                        _index_drop(self.layout, hex_)
                        gc = True
        tmp = os.path.join(self.root, "tmp")
        for name in os.listdir(tmp):
            path = os.path.join(tmp, name)
            m = re.match(r"^pull-([0-9a-f]{64})-", name)
            if m:
                with self._lock(m.group(1), blocking=False) as got:
                    if got:
                        shutil.rmtree(path, ignore_errors=True)
                continue
            m = re.match(r"^trash-(\d+)-", name)
            if m and not _alive(int(m.group(1))):
                shutil.rmtree(path, ignore_errors=True)
        return gc

    def evict(self, keep: Iterable[str] = ()) -> list[str]:
        """Remove least-recently-used images no holder uses until the cache is within max_bytes (none when
        max_bytes is 0). Returns the digests removed ("sha256:<hex>"). keep: hexes never removed this time."""
        removed = []
        with self._lock("store"):
            gc = self._sweep()
            for hex_ in plan_eviction(self.cached(), self.max_bytes, keep):
                with self._lock(hex_, blocking=False) as got:
                    if not got or self.holders("sha256:" + hex_):  # being pulled or just acquired
                        continue
                    try:
                        os.unlink(self._record_path(hex_))
                    except FileNotFoundError:
                        continue
                    _remove_tree(self._rootfs(hex_), os.path.join(self.root, "tmp"))
                    _index_drop(self.layout, hex_)
                    removed.append("sha256:" + hex_)
            if removed or gc:
                for name in os.listdir(os.path.join(self.root, "aliases")):
                    p = os.path.join(self.root, "aliases", name)
                    try:
                        with open(p) as f:
                            if "sha256:" + f.read().strip() in removed:
                                os.unlink(p)
                    except FileNotFoundError:
                        pass
                p = subprocess.run(["umoci", "gc", "--layout", self.layout], capture_output=True,
                                   stdin=subprocess.DEVNULL)
                if p.returncode != 0:
                    raise OSError(f"umoci gc --layout {self.layout} failed: {p.stderr.decode(errors='replace')}")
        return removed


# ---------------------------------------------------------------- helpers

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _credentials(auth: dict | None) -> tuple[str, str] | None:
    if not auth:
        return None
    user, password = auth.get("username") or "", auth.get("password") or ""
    if not user or not password:
        return None
    return user, password


def auth_dir() -> str | None:
    """Where a pull's auth file lives while skopeo reads it: memory (/dev/shm) when it can, never the cache."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK) else None


class _AuthFile:
    """A containers-auth.json with one registry's credentials: 0600, outside the cache, removed on exit."""

    def __init__(self, registry: str, creds: tuple[str, str] | None):
        self.registry, self.creds, self.path = registry, creds, None

    def __enter__(self) -> str | None:
        if self.creds is None:
            return None
        fd, self.path = tempfile.mkstemp(prefix="astraeus-auth-", suffix=".json", dir=auth_dir())  # 0600
        token = base64.b64encode(f"{self.creds[0]}:{self.creds[1]}".encode()).decode()
        with os.fdopen(fd, "w") as f:
            json.dump({"auths": {self.registry: {"auth": token}}}, f)
        return self.path

    def __exit__(self, *exc) -> None:
        if self.path:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def _init_layout(path: str) -> None:
    os.makedirs(os.path.join(path, "blobs", "sha256"), exist_ok=True)
    _write_atomic(os.path.join(path, "oci-layout"), b'{"imageLayoutVersion":"1.0.0"}')
    if not os.path.exists(os.path.join(path, "index.json")):
        _write_atomic(os.path.join(path, "index.json"), b'{"schemaVersion":2,"manifests":[]}')


def _index_edit(layout: str, hex_: str, desc: dict | None) -> None:
    path = os.path.join(layout, "index.json")
    with open(path) as f:
        index = json.load(f)
    keep = [m for m in index.get("manifests") or []
            if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") != hex_]
    if desc is not None:
        keep.append(desc)
    index["manifests"] = keep
    _write_atomic(path, json.dumps(index).encode())


def _index_set(layout: str, hex_: str, desc: dict) -> None:
    _index_edit(layout, hex_, desc)


def _index_drop(layout: str, hex_: str) -> None:
    _index_edit(layout, hex_, None)


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _tree_bytes(path: str) -> int:
    """Bytes a folder's files take (hardlinked files once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            try:
                st = os.lstat(os.path.join(dirpath, n))
            except FileNotFoundError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += 0 if stat.S_ISDIR(st.st_mode) else st.st_size
    return total


def _remove_tree(path: str, trash_dir: str) -> None:
    """Remove a folder: renamed aside first (so a half-removed folder is never mistaken for an image)."""
    if not os.path.lexists(path):
        return
    aside = os.path.join(trash_dir, f"trash-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.rename(path, aside)
    except OSError:
        aside = path
    if os.path.isdir(aside) and not os.path.islink(aside):
        shutil.rmtree(aside, ignore_errors=True)
    else:
        try:
            os.unlink(aside)
        except FileNotFoundError:
            pass
