"""A worker's progress and checkpoint files (issue 47): the worker touches ASTRAEUS_PROGRESS_FILE (it may write a
short text, `step 1234`) as it makes progress and writes ASTRAEUS_CHECKPOINT_FILE after each checkpoint's save; the
agent reports both files' times (and the progress text) with the worker's state. Both lie in `<attempt_dir>/work`
(its owner is the worker's user), so the worker can write them whatever its uid: its working folder in the process
runtime, bound at /run/astraeus/work in a container (oci_spec.WORK_DIR). The folder is the tenant's: the agent reads
it without following symlinks and without blocking on a FIFO."""

from __future__ import annotations

import os
import stat

from astraeus.protocol import WorkerReport

PROGRESS_FILE = ".astraeus-progress"
CHECKPOINT_FILE = ".astraeus-checkpoint"


def progress_env(attempt_dir: str) -> dict[str, str]:
    """The variables naming the files, for a worker whose working folder is `<attempt_dir>/work`."""
    return files_in(os.path.join(attempt_dir, "work"))


def files_in(work: str) -> dict[str, str]:
    """The variables naming the files in `work`, the folder as the worker sees it."""
    return {"ASTRAEUS_PROGRESS_FILE": os.path.join(work, PROGRESS_FILE),
            "ASTRAEUS_CHECKPOINT_FILE": os.path.join(work, CHECKPOINT_FILE)}


def read_progress(attempt_dir: str) -> tuple[float | None, str | None, float | None]:
    """(progress time, its text, checkpoint time) from the files; None for a file not written yet."""
    work = os.path.join(attempt_dir, "work")
    progress_at = text = checkpoint_at = None
    try:
        fd = os.open(os.path.join(work, PROGRESS_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):  # a FIFO or a device is no progress (and is never read)
                progress_at = st.st_mtime
                head = os.read(fd, 200).decode("utf-8", "replace")
                text = head.splitlines()[0].strip() if head.strip() else None
        finally:
            os.close(fd)
    except OSError:
        pass
    try:
        st = os.stat(os.path.join(work, CHECKPOINT_FILE), follow_symlinks=False)
        if stat.S_ISREG(st.st_mode):  # a symlink's own time is no checkpoint
            checkpoint_at = st.st_mtime
    except OSError:
        pass
    return progress_at, text, checkpoint_at


def mark_progress(runtime, reports: list[WorkerReport]) -> list[WorkerReport]:
    """The running attempts' reports with their progress and checkpoint times (a runtime without attempt folders,
    or an attempt that wrote neither file, reports none)."""
    folder = getattr(runtime, "dir", None)
    if folder is None:
        return reports
    out = []
    for r in reports:
        if r.state == "Running":
            try:
                progress_at, text, checkpoint_at = read_progress(folder(r.worker, r.attempt))
            except (OSError, ValueError):
                progress_at = text = checkpoint_at = None
            if progress_at is not None or checkpoint_at is not None:
                r = r.model_copy(update={"progress_at": progress_at, "progress_text": text,
                                         "checkpoint_at": checkpoint_at})
        out.append(r)
    return out
