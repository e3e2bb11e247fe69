"""Test images and a real local registry, for every container test (no mocks: Debian's `docker-registry`,
`skopeo`, `umoci`, `mmdebstrap`).

  tools_missing() -> list[str]                 the tools these helpers need that are not installed
  Registry(auth=None | (user, password))       `docker-registry serve` on 127.0.0.1:<free port>, storage in a
                                               temp folder, plain HTTP (list .host as insecure); started on
                                               creation. .host ("127.0.0.1:PORT"), .stop(), .blob_gets(digest=None)
                                               (successful blob GETs in its access log), .log_text()
  build_busybox_image(layout_dir, tag="busybox", extra=None) -> str
                                               an OCI layout reference "oci:<dir>:busybox" made with umoci from
                                               /usr/bin/busybox (static): /bin/<applet> symlinks, /tmp 1777,
                                               /etc/passwd+group (root, nobody), /etc/astraeus-test-image holding
                                               "busybox test image", Env PATH=/bin:/usr/bin, WorkingDir /work
  build_python_image(layout_dir) -> str        Debian bookworm minbase + python3 (mmdebstrap), plus
                                               /etc/astraeus-test-image ("python test image"), /usr/bin/python ->
                                               python3; Env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:
                                               /sbin:/bin, WorkingDir /work.
                                               Built once and cached in ~/.cache/astraeus-tests/python-image/
                                               (keyed by the recipe's hash; ASTRAEUS_TEST_CACHE moves it)
  push(layout_ref, registry, name) -> str      skopeo copy to the registry; returns "HOST/name" (name with a tag,
                                               ":latest" added when it has none)
  layer_digests(layout_ref) -> list[str]       the image's layer digests ("sha256:…"), to count blob GETs
  manifest_digest(layout_ref) -> str           the image's manifest digest as pushed

The fixtures: tests/conftest.py's `registry` (session, no auth) and `python_image` (session, pushed to it);
tests/containers/conftest.py's `busybox_image` and `auth_registry` (function scope, with .username/.password).
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request

BUSYBOX = "/usr/bin/busybox"
TOOLS = ("docker-registry", "skopeo", "umoci", "htpasswd", "mmdebstrap")
BUSYBOX_TEXT = "busybox test image\n"
PYTHON_TEXT = "python test image\n"
PYTHON_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PYTHON_RECIPE = ["mmdebstrap", "--variant=minbase", "--include=python3", "--skip=output/dev", "--format=tar",
                 "bookworm"]


def tools_missing() -> list[str]:
    out = [t for t in TOOLS if shutil.which(t) is None]
    if not os.path.exists(BUSYBOX) or not _is_static(BUSYBOX):
        out.append(BUSYBOX + " (busybox-static: a static busybox)")
    return out


def _die_with_parent() -> None:
    """In the child: SIGTERM when the test process dies, so a killed test run leaves no registry behind."""
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _is_static(path: str) -> bool:
    """An ELF binary with no program interpreter (busybox-static's, which runs in any image)."""
    with open(path, "rb") as f:
        head = f.read(65536)
    return b"/ld-linux" not in head and b"/ld-musl" not in head


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """Debian's docker-registry on 127.0.0.1, plain HTTP, optionally with a user/password (htpasswd, bcrypt)."""

    def __init__(self, auth: tuple[str, str] | None = None, start: bool = True):
        self.dir = tempfile.mkdtemp(prefix="astraeus-registry-")
        self.auth = auth
        self.username, self.password = auth if auth else (None, None)
        self.proc: subprocess.Popen | None = None
        self.host = ""
        self.log_path = os.path.join(self.dir, "registry.log")
        if start:
            self.start()

    def start(self) -> None:
        last = ""
        for _ in range(5):  # a free port may be taken between choosing and binding: choose again
            port = _free_port()
            self.host = f"127.0.0.1:{port}"
            cfg = os.path.join(self.dir, "config.yml")
            lines = ["version: 0.1", "log:", "  level: info", "  accesslog:", "    disabled: false",
                     "storage:", "  filesystem:", f"    rootdirectory: {self.dir}/storage",
                     "  delete:", "    enabled: true", "http:", f"  addr: {self.host}"]
            if self.auth:
                htp = os.path.join(self.dir, "htpasswd")
                subprocess.run(["htpasswd", "-iBc", htp, self.auth[0]], input=self.auth[1].encode(),
                               check=True, capture_output=True)  # the password on stdin, not in argv
                lines += ["auth:", "  htpasswd:", "    realm: astraeus-test", f"    path: {htp}"]
            with open(cfg, "w") as f:
                f.write("\n".join(lines) + "\n")
            log = open(self.log_path, "ab")
            self.proc = subprocess.Popen(["docker-registry", "serve", cfg], stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=_die_with_parent)
            log.close()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2).close()
                    return
                except urllib.error.HTTPError as e:
                    if e.code == 401 and self.auth:
                        return
                except OSError:
                    pass
                time.sleep(0.05)
            last = self.log_text()[-2000:]
            self.stop(remove=False)
        raise RuntimeError(f"docker-registry did not start on 127.0.0.1: {last}")

    def stop(self, remove: bool = True) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)

    def log_text(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def blob_gets(self, digest: str | None = None) -> int:
        """Successful GETs of blobs (of this digest, or of any) in the access log."""
        n = 0
        for line in self.log_text().splitlines():
            if '"GET /v2/' not in line or "/blobs/sha256:" not in line:
                continue
            try:
                request, status = line.split('"GET ', 1)[1].split('"', 1)
            except ValueError:
                continue
            code = status.split()[0] if status.split() else ""
            if code not in ("200", "206", "307") or (digest and not request.split()[0].endswith("/" + digest)):
                continue
            n += 1
        return n

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return p


def _tar_dir(tf: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, mode, 0
    tf.addfile(ti)


def _tar_file(tf: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime = len(data), mode, 0
    tf.addfile(ti, io.BytesIO(data))


def _new_layout(layout_dir: str, tag: str) -> str:
    if not os.path.exists(os.path.join(layout_dir, "index.json")):
        os.makedirs(os.path.dirname(os.path.abspath(layout_dir)), exist_ok=True)
        _run(["umoci", "init", "--layout", layout_dir])
    _run(["umoci", "new", "--image", f"{layout_dir}:{tag}"])
    return f"{layout_dir}:{tag}"


def build_busybox_image(layout_dir: str, tag: str = "busybox", extra: dict[str, str] | None = None) -> str:
    """An OCI layout reference ("oci:<layout_dir>:<tag>") of a busybox image (one layer). extra: more files
    (path in the image → text), e.g. to make an image whose layer no other image shares."""
    image = _new_layout(layout_dir, tag)
    applets = _run([BUSYBOX, "--list"]).stdout.split()
    with tempfile.TemporaryDirectory() as tmp:
        layer = os.path.join(tmp, "layer.tar")
        with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as tf:
            for d in ("bin", "etc", "usr", "usr/bin", "work", "root", "proc", "sys", "dev", "home"):
                _tar_dir(tf, d)
            _tar_dir(tf, "tmp", 0o1777)
            with open(BUSYBOX, "rb") as f:
                _tar_file(tf, "bin/busybox", f.read(), 0o755)
            for a in applets:
                if a != "busybox":
                    ti = tarfile.TarInfo("bin/" + a)
                    ti.type, ti.linkname, ti.mode, ti.mtime = tarfile.SYMTYPE, "busybox", 0o777, 0
                    tf.addfile(ti)
            _tar_file(tf, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"
                                        b"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
            _tar_file(tf, "etc/group", b"root:x:0:\nnogroup:x:65534:\n")
            _tar_file(tf, "etc/astraeus-test-image", BUSYBOX_TEXT.encode())
            for path, text in (extra or {}).items():
                _tar_file(tf, path.lstrip("/"), text.encode())
        _run(["umoci", "raw", "add-layer", "--image", image, layer])
    _run(["umoci", "config", "--image", image, "--config.env", "PATH=/bin:/usr/bin",
          "--config.workingdir", "/work"])
    return "oci:" + image


def _cache_root() -> str:
    return os.environ.get("ASTRAEUS_TEST_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                    "astraeus-tests")


def build_python_image(layout_dir: str, tag: str = "python") -> str:
    """An OCI layout reference of a Debian bookworm image with python3 (built once, then copied from the cache)."""
    recipe = json.dumps({"mmdebstrap": PYTHON_RECIPE, "text": PYTHON_TEXT, "path": PYTHON_PATH, "v": 2})
    key = hashlib.sha256(recipe.encode()).hexdigest()[:16]
    base = os.path.join(_cache_root(), "python-image")
    cached = os.path.join(base, key)
    os.makedirs(base, exist_ok=True)
    with open(os.path.join(base, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; the others wait and find it built
        if not os.path.exists(os.path.join(cached, "index.json")):
            work = tempfile.mkdtemp(prefix=f"build-{key}-", dir=base)
            try:
                layout = os.path.join(work, "oci")
                image = _new_layout(layout, "python")
                rootfs_tar = os.path.join(work, "rootfs.tar")
                _run([*PYTHON_RECIPE, rootfs_tar], timeout=900)
                _run(["umoci", "raw", "add-layer", "--image", image, rootfs_tar])
                os.unlink(rootfs_tar)
                extra = os.path.join(work, "extra.tar")
                with tarfile.open(extra, "w", format=tarfile.PAX_FORMAT) as tf:
                    _tar_dir(tf, "work")
                    _tar_file(tf, "etc/astraeus-test-image", PYTHON_TEXT.encode())
                    ti = tarfile.TarInfo("usr/bin/python")  # the tests run `python …`, as on the host
                    ti.type, ti.linkname, ti.mode, ti.mtime = tarfile.SYMTYPE, "python3", 0o777, 0
                    tf.addfile(ti)
                _run(["umoci", "raw", "add-layer", "--image", image, extra])
                _run(["umoci", "config", "--image", image, "--config.env", "PATH=" + PYTHON_PATH,
                      "--config.workingdir", "/work"])
                os.rename(layout, cached)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    if os.path.exists(layout_dir):
        shutil.rmtree(layout_dir)
    shutil.copytree(cached, layout_dir, copy_function=os.link)  # hardlinks: blobs are never modified
    if tag != "python":
        _run(["umoci", "tag", "--image", f"{layout_dir}:python", tag])
    return f"oci:{layout_dir}:{tag}"


def push(layout_ref: str, registry: Registry, name: str) -> str:
    """Copy an OCI layout image to the registry as `name` (a tag added if none); returns "HOST/name:tag"."""
    if ":" not in name.rsplit("/", 1)[-1] and "@" not in name:
        name += ":latest"
    dest = f"{registry.host}/{name}"
    cmd = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false"]
    authfile = None
    try:
        if registry.auth:
            fd, authfile = tempfile.mkstemp(suffix=".json")
            import base64
            token = base64.b64encode(f"{registry.auth[0]}:{registry.auth[1]}".encode()).decode()
            with os.fdopen(fd, "w") as f:
                json.dump({"auths": {registry.host: {"auth": token}}}, f)
            cmd += ["--dest-authfile", authfile]
        _run([*cmd, layout_ref, f"docker://{dest}"])
    finally:
        if authfile:
            os.unlink(authfile)
    return dest


def _layout_manifest(layout_ref: str) -> tuple[str, dict]:
    _, layout, tag = layout_ref.split(":", 2)
    with open(os.path.join(layout, "index.json")) as f:
        desc = next(m for m in json.load(f)["manifests"]
                    if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") == tag)
    with open(os.path.join(layout, "blobs", "sha256", desc["digest"].split(":", 1)[1])) as f:
        return desc["digest"], json.load(f)


def layer_digests(layout_ref: str) -> list[str]:
    return [d["digest"] for d in _layout_manifest(layout_ref)[1]["layers"]]


def manifest_digest(layout_ref: str) -> str:
    """The manifest digest (an OCI layout's manifest is pushed unchanged, so the registry shows the same)."""
    return _layout_manifest(layout_ref)[0]
