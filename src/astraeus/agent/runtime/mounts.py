"""Mount-namespace helpers used by the shim (stdlib only: ctypes around libc).

A worker's drives and configs are bind mounts made inside a private mount namespace, so nothing is mounted
on the host. Drives are resolved WITHOUT following symlinks: every component below the granted root is
opened with O_PATH|O_NOFOLLOW|O_DIRECTORY, and the final descriptor is bind-mounted through
/proc/self/fd/N, so a symlink swapped in between the check and the mount cannot redirect it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import stat

CLONE_NEWNS = 0x00020000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.unshare.argtypes = [ctypes.c_int]


class MountError(Exception):
    """A drive or config could not be set up; the message says which and why."""


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if _libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {source} on {target}: {os.strerror(e)}")


def unshare_mount_namespace() -> None:
    """Enter a new mount namespace whose mounts do not propagate back to the host."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        e = ctypes.get_errno()
        raise MountError(f"cannot create a mount namespace (unshare CLONE_NEWNS): {os.strerror(e)}; the agent must run as root")
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def _components(path: str) -> list[str]:
    return [c for c in path.split("/") if c not in ("", ".")]


def open_drive_dir(host_path: str, granted_root: str | None, create: bool) -> int:
    """Open host_path (a directory under granted_root) without following any symlink below the root.

    Returns an O_PATH descriptor. With create, missing folders are made (mode 0755)."""
    if not os.path.isabs(host_path):
        raise MountError(f"drive path {host_path!r} is not absolute")
    root = granted_root or "/"
    if not os.path.isabs(root):
        raise MountError(f"granted host path {root!r} is not absolute")
    root = os.path.normpath(root)
    hp = os.path.normpath(host_path)
    if ".." in _components(host_path):
        raise MountError(f"drive path {host_path!r} may not contain '..'")
    rel = os.path.relpath(hp, root)
    if rel == ".":
        rel_parts: list[str] = []
    elif rel.startswith(".."):
        raise MountError(f"drive path {host_path} is outside the granted host path {root}")
    else:
        rel_parts = _components(rel)
    if create:
        os.makedirs(root, exist_ok=True)  # the granted root is the admin's; it may be followed
    try:
        fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise MountError(f"granted host path {root}: {e.strerror}") from None
    walked = root
    try:
        for part in rel_parts:
            walked = os.path.join(walked, part)
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    raise MountError(f"drive path {walked} does not exist (the drive does not allow create)") from None
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise MountError(f"drive path {walked} is a symlink; symlinks are refused in drive paths")
            if not stat.S_ISDIR(st.st_mode):
                raise MountError(f"drive path {walked} is not a directory")
            try:
                nfd = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ENOTDIR, errno.ELOOP):
                    raise MountError(f"drive path {walked} is a symlink; symlinks are refused in drive paths") from None
                raise MountError(f"drive path {walked}: {e.strerror}") from None
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def ensure_mountpoint(path: str, is_dir: bool) -> None:
    """Make `path` exist so something can be mounted on it, touching the host as little as possible.

    If the path exists, nothing is made. If only the last component is missing, it is made on the host (an
    empty folder, or an empty file for a config). If a parent is missing too, the topmost missing folder is
    made on the host (empty) and a tmpfs is mounted on it inside the namespace, so the rest is built in
    memory and never shows on the host."""
    if not os.path.isabs(path):
        raise MountError(f"mount path {path!r} is not absolute")
    path = os.path.normpath(path)
    if os.path.lexists(path):
        if is_dir and not os.path.isdir(path):
            raise MountError(f"mount path {path} exists and is not a folder")
        if not is_dir and os.path.isdir(path):
            raise MountError(f"config mount path {path} is a folder")
        return
    parts = _components(path)
    top = "/"
    for i in range(len(parts)):
        top = "/" + "/".join(parts[: i + 1])
        if not os.path.lexists(top):
            break
    if top != path:
        os.makedirs(top, exist_ok=True)
        mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
        os.makedirs(os.path.dirname(path), exist_ok=True)
    if is_dir:
        os.makedirs(path, exist_ok=True)
    else:
        with open(path, "a"):
            pass


def bind_drive(host_path: str, mount_path: str, read_only: bool, create: bool, granted_root: str | None) -> None:
    fd = open_drive_dir(host_path, granted_root, create)
    try:
        ensure_mountpoint(mount_path, is_dir=True)
        try:
            mount(f"/proc/self/fd/{fd}", mount_path, None, MS_BIND)
            if read_only:
                mount(None, mount_path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        except OSError as e:
            raise MountError(f"cannot mount drive {host_path} at {mount_path}: {e.strerror}") from None
    finally:
        os.close(fd)


def bind_config(source_file: str, mount_path: str) -> None:
    """Bind a file (the config's value, written by the shim) read-only at mount_path."""
    ensure_mountpoint(mount_path, is_dir=False)
    try:
        mount(source_file, mount_path, None, MS_BIND)
        mount(None, mount_path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    except OSError as e:
        raise MountError(f"cannot mount config at {mount_path}: {e.strerror}") from None
