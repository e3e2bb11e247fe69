"""Pulling images into the machine's cache: real pulls from a real local registry (docker-registry), skopeo and
umoci; what a user reads when a pull fails; one pull per digest across processes; eviction."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from astraeus.agent.runtime.oci_images import (
    CachedImage,
    ImageCache,
    PullError,
    auth_dir,
    machine_arch,
    pick_platform,
    plan_eviction,
)
from astraeus.imageref import ImageRef
from tests import oci

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _unique_image(tmp_path, registry, name: str) -> tuple[str, str]:
    """A busybox image whose layer no other image has: (reference in the registry, its layer digest)."""
    layout = oci.build_busybox_image(str(tmp_path / f"layout-{name}"), extra={"etc/unique": f"{name} {time.time_ns()}"})
    return oci.push(layout, registry, f"test/{name}:1"), oci.layer_digests(layout)[0]


def test_pull_unpacks_the_image_and_reads_its_config(tmp_path, registry, busybox_image, busybox_layout):
    cache = ImageCache(str(tmp_path / "cache"), insecure=[registry.host])
    image = cache.pull(busybox_image)
    assert image.ref == busybox_image
    assert image.digest == oci.manifest_digest(busybox_layout)
    assert image.rootfs == str(tmp_path / "cache" / "rootfs" / image.digest.split(":")[1])
    with open(os.path.join(image.rootfs, "etc", "astraeus-test-image")) as f:
        assert f.read() == "busybox test image\n"
    assert os.readlink(os.path.join(image.rootfs, "bin", "sh")) == "busybox"
    assert os.stat(os.path.join(image.rootfs, "tmp")).st_mode & 0o7777 == 0o1777
    assert os.path.isdir(os.path.join(image.rootfs, "work"))
    if os.geteuid() == 0:
        assert os.stat(os.path.join(image.rootfs, "bin", "busybox")).st_uid == 0
    assert image.config.env == ["PATH=/bin:/usr/bin"]
    assert image.config.working_dir == "/work"
    assert image.config.user == ""
    assert image.config.entrypoint is None and image.config.cmd is None
    assert image.size > os.path.getsize("/usr/bin/busybox")
    # the cache's layout is a real OCI layout that umoci reads: the image is tagged there by its digest hex
    p = subprocess.run(["umoci", "stat", "--json", "--image", f"{cache.layout}:{image.digest.split(':')[1]}"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_pull_by_digest_and_cached_image_not_pulled_again(tmp_path, registry, busybox_layout):
    ref, layer = _unique_image(tmp_path, registry, "again")
    cache = ImageCache(str(tmp_path / "cache"), insecure=[registry.host])
    first = cache.pull(ref)
    assert registry.blob_gets(layer) == 1
    by_digest = f"{registry.host}/test/again@{first.digest}"
    again = ImageCache(str(tmp_path / "cache"), insecure=[registry.host]).pull(by_digest)  # another instance
    assert again.digest == first.digest and again.rootfs == first.rootfs
    assert cache.pull(ref).digest == first.digest
    assert registry.blob_gets(layer) == 1  # not even a blob fetched again
    # a digest reference to a cached image needs no registry at all
    registry_log = registry.log_text()
    assert ImageCache(str(tmp_path / "cache")).pull(by_digest).digest == first.digest  # not even insecure
    assert registry.log_text() == registry_log
    # and a fresh cache pulls by digest from the registry
    fresh = ImageCache(str(tmp_path / "fresh"), insecure=[registry.host]).pull(by_digest)
    assert fresh.digest == first.digest
    with open(os.path.join(fresh.rootfs, "etc", "astraeus-test-image")) as f:
        assert f.read() == "busybox test image\n"


def test_unknown_image(tmp_path, registry, busybox_image):
    cache = ImageCache(str(tmp_path / "cache"), insecure=[registry.host])
    with pytest.raises(PullError) as e:
        cache.pull(f"{registry.host}/nope:1")
    assert str(e.value).startswith(f"image {registry.host}/nope:1 not found")
    with pytest.raises(PullError) as e:
        cache.pull(f"{registry.host}/test/busybox:no-such-tag")
    assert str(e.value).startswith(f"image {registry.host}/test/busybox:no-such-tag not found")
    pinned = f"{registry.host}/test/busybox@sha256:{'0' * 64}"
    with pytest.raises(PullError) as e:
        cache.pull(pinned)
    assert str(e.value).startswith(f"image {pinned} not found")
    assert os.listdir(tmp_path / "cache" / "rootfs") == []
    assert os.listdir(tmp_path / "cache" / "records") == []


def test_bad_reference_says_what_to_change(tmp_path):
    cache = ImageCache(str(tmp_path / "cache"))
    for bad, says in [("", "the image is empty"), ("Busybox:1", "lowercase"), ("busybox:-x", "the tag"),
                      ("busybox@sha256:abc", "64 lowercase hex"), ("a b", "no spaces")]:
        with pytest.raises(PullError) as e:
            cache.pull(bad)
        assert says in str(e.value), (bad, str(e.value))


def test_unreachable_registry(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cache = ImageCache(str(tmp_path / "cache"), insecure=[f"127.0.0.1:{port}"])
    with pytest.raises(PullError) as e:
        cache.pull(f"127.0.0.1:{port}/team/eval:1")
    assert str(e.value) == f"image 127.0.0.1:{port}/team/eval:1: registry 127.0.0.1:{port} unreachable (connection refused)"


def test_hung_registry_times_out(tmp_path):
    with socket.socket() as s:  # accepts connections, never answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        host = f"127.0.0.1:{s.getsockname()[1]}"
        cache = ImageCache(str(tmp_path / "cache"), insecure=[host], resolve_timeout=2)
        with pytest.raises(PullError) as e:
            cache.pull(f"{host}/team/eval:1")
    assert str(e.value) == f"image {host}/team/eval:1: registry {host} unreachable (no answer in time)"


def test_plain_http_registry_must_be_listed_insecure(tmp_path, registry, busybox_image):
    cache = ImageCache(str(tmp_path / "cache"), insecure=["127.0.0.1:1"])  # another registry is listed
    with pytest.raises(PullError) as e:
        cache.pull(busybox_image)
    assert str(e.value).startswith(f"image {busybox_image}: registry {registry.host} speaks plain HTTP; "
                                   "list it in ASTRAEUS_INSECURE_REGISTRIES")


def _scan_processes(needle: bytes, stop: threading.Event, found: list[str]) -> None:
    me = str(os.getpid())
    while not stop.is_set():
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid == me:
                continue
            for what in ("cmdline", "environ"):
                try:
                    with open(f"/proc/{pid}/{what}", "rb") as f:
                        if needle in f.read():
                            found.append(f"{pid} {what}")
                except OSError:
                    pass
        time.sleep(0.005)


def _files_holding(root: str, needle: bytes) -> list[str]:
    out = []
    for dirpath, _, files in os.walk(root):
        for n in files:
            p = os.path.join(dirpath, n)
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            with open(p, "rb") as f:
                if needle in f.read():
                    out.append(p)
    return out


def test_registry_credentials(tmp_path, auth_registry, busybox_layout):
    ref = oci.push(busybox_layout, auth_registry, "private/busybox:1")
    host, password = auth_registry.host, auth_registry.password
    cache = ImageCache(str(tmp_path / "cache"), insecure=[host])
    with pytest.raises(PullError) as e:
        cache.pull(ref)
    assert str(e.value).startswith(f"image {ref}: unauthorized: no credentials for {host}")
    with pytest.raises(PullError) as e:
        cache.pull(ref, {"username": auth_registry.username, "password": "wrong-" + password})
    assert str(e.value).startswith(f"image {ref}: unauthorized: the workspace's credentials for {host} "
                                   "were refused (set them with")
    assert password not in str(e.value)

    stop, seen = threading.Event(), []
    scanner = threading.Thread(target=_scan_processes, args=(password.encode(), stop, seen))
    scanner.start()
    try:
        image = cache.pull(ref, {"username": auth_registry.username, "password": password})
    finally:
        stop.set()
        scanner.join()
    assert seen == []  # never in a process's argv or environment
    with open(os.path.join(image.rootfs, "etc", "astraeus-test-image")) as f:
        assert f.read() == "busybox test image\n"
    assert _files_holding(str(tmp_path / "cache"), password.encode()) == []
    import base64  # nor in the auth file's encoding, which skopeo reads: it is gone
    token = base64.b64encode(f"{auth_registry.username}:{password}".encode())
    # the image is cached, but a run without credentials does not get it by its digest: the registry decides
    pinned = f"{host}/private/busybox@{image.digest}"
    with pytest.raises(PullError) as e:
        cache.pull(pinned)
    assert str(e.value).startswith(f"image {pinned}: unauthorized: no credentials for {host}")
    gets = auth_registry.blob_gets()
    assert cache.pull(pinned, {"username": auth_registry.username, "password": password}).rootfs == image.rootfs
    assert auth_registry.blob_gets() == gets  # asked, not fetched again
    where = auth_dir() or tempfile.gettempdir()
    leftovers = [n for n in os.listdir(where) if n.startswith("astraeus-auth-")]
    for n in leftovers:  # another test's pull may be running; ours must be gone
        with open(os.path.join(where, n), "rb") as f:
            assert token not in f.read()


_PULL = """
import json, sys
from astraeus.agent.runtime.oci_images import ImageCache
image = ImageCache(sys.argv[1], insecure=[sys.argv[2]]).pull(sys.argv[3])
print(json.dumps({"digest": image.digest, "rootfs": image.rootfs}))
"""


def test_two_processes_pulling_at_once_pull_once(tmp_path, registry):
    ref, layer = _unique_image(tmp_path, registry, "together")
    root = str(tmp_path / "cache")
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO_ROOT, "src"))
    procs = [subprocess.Popen([sys.executable, "-c", _PULL, root, registry.host, ref], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(3)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    assert len({r["digest"] for r in results}) == 1
    assert len({r["rootfs"] for r in results}) == 1
    assert registry.blob_gets(layer) == 1
    with open(os.path.join(results[0]["rootfs"], "etc", "unique")) as f:
        assert f.read().startswith("together ")
    assert os.listdir(os.path.join(root, "tmp")) == []


def test_different_images_pulled_at_once_all_land_in_the_shared_layout(tmp_path, registry):
    refs = [_unique_image(tmp_path, registry, f"apart-{i}")[0] for i in range(3)]
    root = str(tmp_path / "cache")
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO_ROOT, "src"))
    procs = [subprocess.Popen([sys.executable, "-c", _PULL, root, registry.host, ref], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for ref in refs]
    digests = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        digests.append(json.loads(out)["digest"])
    cache = ImageCache(root)
    assert sorted(f"sha256:{c.hex}" for c in cache.cached()) == sorted(digests)
    with open(os.path.join(cache.layout, "index.json")) as f:
        tags = {m["annotations"]["org.opencontainers.image.ref.name"] for m in json.load(f)["manifests"]}
    assert tags == {d.split(":")[1] for d in digests}
    for d in digests:  # each readable in the shared layout, and its files unpacked
        p = subprocess.run(["umoci", "stat", "--image", f"{cache.layout}:{d.split(':')[1]}"], capture_output=True)
        assert p.returncode == 0, p.stderr
        assert os.path.exists(os.path.join(cache.get(d).rootfs, "etc", "unique"))


def test_eviction_removes_least_recently_used_image_no_holder_uses(tmp_path, registry):
    a, layer_a = _unique_image(tmp_path, registry, "evict-a")
    b, layer_b = _unique_image(tmp_path, registry, "evict-b")
    c, layer_c = _unique_image(tmp_path, registry, "evict-c")
    cache = ImageCache(str(tmp_path / "cache"), insecure=[registry.host])
    image_a = cache.pull(a)
    cache.acquire(image_a.digest, "run-1.w0.a0")
    image_b = cache.pull(b)
    cache.pull(a)  # a is used again: b is now the least recently used
    # room for two of them: pulling c evicts one, the least recently used: b
    cache.max_bytes = image_a.size + image_b.size + 1024
    time.sleep(0.01)
    image_c = cache.pull(c)
    assert cache.get(image_b.digest) is None
    assert not os.path.exists(image_b.rootfs)
    blobs = os.listdir(os.path.join(cache.layout, "blobs", "sha256"))
    assert layer_b.split(":")[1] not in blobs  # its blobs are garbage-collected
    assert layer_a.split(":")[1] in blobs and layer_c.split(":")[1] in blobs
    assert cache.get(image_a.digest) is not None and cache.get(image_c.digest) is not None
    assert cache.total_bytes() <= cache.max_bytes

    # now a is the least recently used, but held: a tighter limit evicts c instead
    cache.max_bytes = image_a.size + 1024
    assert cache.evict() == [image_c.digest]
    assert os.path.exists(image_a.rootfs) and not os.path.exists(image_c.rootfs)
    # over the limit with only a held image left: nothing to evict
    cache.max_bytes = 1
    assert cache.evict() == []
    assert cache.holders(image_a.digest) == ["run-1.w0.a0"]
    cache.release(image_a.digest, "run-1.w0.a0")
    assert cache.holders(image_a.digest) == []
    assert cache.evict() == [image_a.digest]
    assert os.listdir(os.path.join(cache.layout, "blobs", "sha256")) == []
    assert os.listdir(os.path.join(cache.root, "rootfs")) == []
    # evicted means pulled again when asked for
    before = registry.blob_gets(layer_a)
    cache.max_bytes = 0
    assert cache.pull(a).digest == image_a.digest
    assert registry.blob_gets(layer_a) == before + 1


def test_eviction_with_a_holder_on_pull(tmp_path, registry):
    ref, _ = _unique_image(tmp_path, registry, "held")
    cache = ImageCache(str(tmp_path / "cache"), max_bytes=1, insecure=[registry.host])
    image = cache.pull(ref, holder="run-2.w0.a0")  # over the limit, but held from the start
    assert cache.holders(image.digest) == ["run-2.w0.a0"]
    assert cache.evict() == [] and os.path.isdir(image.rootfs)
    with pytest.raises(ValueError, match="holder"):
        cache.acquire(image.digest, "../escape")
    with pytest.raises(ValueError, match="sha256"):
        cache.release("not-a-digest", "run-2.w0.a0")


def test_holders_left_by_a_crash_are_pruned_and_dead_pulls_swept(tmp_path, registry):
    ref, _ = _unique_image(tmp_path, registry, "pruned")
    cache = ImageCache(str(tmp_path / "cache"), insecure=[registry.host])
    image = cache.pull(ref, holder="w-live.a0")
    cache.acquire(image.digest, "w-gone.a3")
    assert cache.prune_holders(live=["w-live.a0"]) == [(image.digest, "w-gone.a3")]
    assert cache.holders(image.digest) == ["w-live.a0"]
    # what a pull or an eviction killed midway leaves in tmp/ goes at the next eviction
    dead_pull = tmp_path / "cache" / "tmp" / f"pull-{'e' * 64}-x1"
    dead_trash = tmp_path / "cache" / "tmp" / "trash-4194305-1"  # above Linux's largest pid
    unrecorded = tmp_path / "cache" / "rootfs" / ("f" * 64)  # unpacked, then killed before its record
    for d in (dead_pull, dead_trash, unrecorded):
        (d / "rootfs" / "etc").mkdir(parents=True)
    assert cache.evict() == []
    assert os.listdir(tmp_path / "cache" / "tmp") == []
    assert os.listdir(tmp_path / "cache" / "rootfs") == [image.digest.split(":")[1]]
    assert cache.get(image.digest) is not None


def test_plan_eviction_is_lru_and_skips_held():
    shared = {"s" * 64: 100}
    images = [CachedImage("a", 1.0, 10, {"a" * 64: 10, **shared}),
              CachedImage("b", 2.0, 10, {"b" * 64: 10, **shared}, held=True),
              CachedImage("c", 3.0, 10, {"c" * 64: 10, **shared})]
    assert plan_eviction(images, 0) == []  # no limit
    assert plan_eviction(images, 1000) == []  # 3*20 + 100 shared once
    assert plan_eviction(images, 150) == ["a"]
    assert plan_eviction(images, 1) == ["a", "c"]  # b is held
    assert plan_eviction(images, 1, keep=["a"]) == ["c"]


def _write_blob(layout: str, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(layout, "blobs", "sha256", digest), "wb") as f:
        f.write(data)
    return {"digest": "sha256:" + digest, "size": len(data)}


def _multi_arch(layout_ref: str, tag: str, arches: list[str]) -> str:
    """Add to the busybox layout an index (tag) naming a manifest per arch (the same layer, its config's
    architecture changed)."""
    _, layout, base_tag = layout_ref.split(":", 2)
    with open(os.path.join(layout, "index.json")) as f:
        index = json.load(f)
    base = next(m for m in index["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == base_tag)
    with open(os.path.join(layout, "blobs", "sha256", base["digest"].split(":")[1])) as f:
        manifest = json.load(f)
    with open(os.path.join(layout, "blobs", "sha256", manifest["config"]["digest"].split(":")[1])) as f:
        config = json.load(f)
    entries = []
    for arch in arches:
        cfg = _write_blob(layout, json.dumps({**config, "architecture": arch}).encode())
        m = _write_blob(layout, json.dumps({**manifest, "config": {**manifest["config"], **cfg}}).encode())
        entries.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", **m,
                        "platform": {"os": "linux", "architecture": arch}})
    idx = _write_blob(layout, json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                                          "manifests": entries}).encode())
    index["manifests"].append({"mediaType": "application/vnd.oci.image.index.v1+json", **idx,
                               "annotations": {"org.opencontainers.image.ref.name": tag}})
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump(index, f)
    return f"oci:{layout}:{tag}"


def _push_all(layout_ref: str, registry, name: str) -> str:
    dest = f"{registry.host}/{name}"
    subprocess.run(["skopeo", "copy", "--quiet", "--all", "--dest-tls-verify=false", layout_ref,
                    f"docker://{dest}"], check=True, capture_output=True)
    return dest


def test_multi_arch_index_gives_this_machines_manifest(tmp_path, registry):
    here = machine_arch()
    other = "arm64" if here != "arm64" else "amd64"
    layout = oci.build_busybox_image(str(tmp_path / "layout"))
    ref = _push_all(_multi_arch(layout, "multi", [other, here]), registry, "test/multi:1")
    cache = ImageCache(str(tmp_path / "cache"), insecure=[registry.host])
    image = cache.pull(ref)
    with open(os.path.join(image.rootfs, "etc", "astraeus-test-image")) as f:
        assert f.read() == "busybox test image\n"
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}"],
                         capture_output=True, check=True).stdout
    index = json.loads(raw)
    assert image.digest == pick_platform(index, here)
    # pinned to the index's digest: the same image, found in the cache without the registry
    pinned = f"{registry.host}/test/multi@sha256:{hashlib.sha256(raw).hexdigest()}"
    log = registry.log_text()
    assert cache.pull(pinned).digest == image.digest
    assert registry.log_text() == log

    only_other = _push_all(_multi_arch(layout, "foreign", [other]), registry, "test/foreign:1")
    with pytest.raises(PullError) as e:
        cache.pull(only_other)
    assert str(e.value).startswith(f"image {only_other} has no linux/{here} variant (it has: linux/{other})")


def test_python_image(tmp_path, registry, python_image):
    image = ImageCache(str(tmp_path / "cache"), insecure=[registry.host]).pull(python_image)
    with open(os.path.join(image.rootfs, "etc", "astraeus-test-image")) as f:
        assert f.read() == "python test image\n"
    assert os.path.exists(os.path.join(image.rootfs, "usr", "bin", "python3"))
    assert any(e.startswith("PATH=") and "/usr/bin" in e for e in image.config.env)


def test_image_references_read_as_docker_reads_them():
    assert str(ImageRef.parse("ubuntu")) == "docker.io/library/ubuntu:latest"
    assert ImageRef.parse("pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime").name == "docker.io/pytorch/pytorch"
    assert ImageRef.parse("docker.io/library/busybox:1").transport == "docker://docker.io/library/busybox:1"
    assert ImageRef.parse("index.docker.io/busybox").name == "docker.io/library/busybox"
    r = ImageRef.parse("127.0.0.1:5000/team/eval:1")
    assert (r.registry, r.repository, r.tag) == ("127.0.0.1:5000", "team/eval", "1")
    assert ImageRef.parse("localhost/x").registry == "localhost"
    d = "sha256:" + "a" * 64
    assert ImageRef.parse(f"busybox:1@{d}").transport == f"docker://docker.io/library/busybox@{d}"
    for bad in ["", "UPPER", "busybox:", "busybox@sha256:xyz", "host:99999999/x", "a//b", "with space"]:
        with pytest.raises(ValueError):
            ImageRef.parse(bad)


def test_docker_manifest_image(tmp_path, registry, busybox_layout):
    """Most registries serve Docker v2 schema 2 manifests: pulled by the registry's digest, stored converted."""
    ref = f"{registry.host}/test/docker-format:1"
    subprocess.run(["skopeo", "copy", "--quiet", "--format", "v2s2", "--dest-tls-verify=false", busybox_layout,
                    f"docker://{ref}"], check=True, capture_output=True)
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}"],
                         capture_output=True, check=True).stdout
    assert json.loads(raw)["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    image = ImageCache(str(tmp_path / "cache"), insecure=[registry.host]).pull(ref)
    assert image.digest == "sha256:" + hashlib.sha256(raw).hexdigest()
    assert image.config.working_dir == "/work"
    with open(os.path.join(image.rootfs, "etc", "astraeus-test-image")) as f:
        assert f.read() == "busybox test image\n"


def test_the_machines_own_credentials_are_never_used(tmp_path, monkeypatch, auth_registry, busybox_layout):
    """A run without credentials pulls anonymously, even when skopeo would find some on the machine."""
    import base64
    ref = oci.push(busybox_layout, auth_registry, "private/busybox:1")
    machine_auth = tmp_path / "machine-auth.json"
    token = base64.b64encode(f"{auth_registry.username}:{auth_registry.password}".encode()).decode()
    machine_auth.write_text(json.dumps({"auths": {auth_registry.host: {"auth": token}}}))
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(machine_auth))  # skopeo's default auth file
    check = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}"],
                           capture_output=True)
    assert check.returncode == 0  # skopeo alone would use them
    with pytest.raises(PullError) as e:
        ImageCache(str(tmp_path / "cache"), insecure=[auth_registry.host]).pull(ref)
    assert "no credentials for" in str(e.value)


def test_a_pull_killed_midway_leaves_nothing_that_breaks_the_next(tmp_path, registry, python_image):
    """The agent (and its skopeo) killed with SIGKILL while copying: the next pull gets the whole image."""
    import signal

    root = str(tmp_path / "cache")
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO_ROOT, "src"))
    p = subprocess.Popen([sys.executable, "-c", _PULL, root, registry.host, python_image], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    tmp = os.path.join(root, "tmp")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and p.poll() is None:  # until skopeo has started writing blobs
        pulls = [n for n in os.listdir(tmp) if n.startswith("pull-")] if os.path.isdir(tmp) else []
        try:  # skopeo makes the blobs' folder after the pull's own: not there yet, look again
            if pulls and any(os.scandir(os.path.join(tmp, pulls[0], "oci", "blobs", "sha256"))):
                break
        except FileNotFoundError:
            pass
        time.sleep(0.01)
    os.killpg(p.pid, signal.SIGKILL)
    assert p.wait() == -signal.SIGKILL  # killed, not finished
    assert [n for n in os.listdir(tmp) if n.startswith("pull-")]  # and midway
    image = ImageCache(root, insecure=[registry.host]).pull(python_image)
    with open(os.path.join(image.rootfs, "etc", "astraeus-test-image")) as f:
        assert f.read() == "python test image\n"
    assert os.path.exists(os.path.join(image.rootfs, "usr", "bin", "python3"))
    ImageCache(root, max_bytes=0).evict()
    assert os.listdir(tmp) == []
