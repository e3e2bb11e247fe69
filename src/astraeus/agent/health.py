"""The machine's health as its agent sees it (issue 47; docs/health.md): its GPUs' faults from NVML, and the site's
health-check command. Sent in each report (protocol.Report.gpu_faults, .health_check); the control plane decides
what they mean (server/health.py): a fatal fault quarantines the GPU, a failed check drains the machine.

NVML (pynvml, from nvidia-ml-py), per GPU:
  XID events            nvmlEventSetCreate + nvmlDeviceRegisterEvents(nvmlEventTypeXidCriticalError) +
                        nvmlEventSetWait: each XID is reported for XID_KEPT seconds (an event is seen once)
  uncorrectable ECC     nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE_ECC) > 0
  retired pages pending nvmlDeviceGetRetiredPagesPendingStatus; remapped rows pending or failed:
                        nvmlDeviceGetRemappedRows (corrected, uncorrected, pending, failure)
  slowdowns (not fatal) nvmlDeviceGetCurrentClocksThrottleReasons: HW/SW thermal, HW power brake
  not answering         any call on the GPU failing with NVML_ERROR_GPU_IS_LOST (or a handle not found)
A simulated GPU has no NVML: its faults are injected by an admin on the control plane.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time

from astraeus import protocol as P

log = logging.getLogger("astraeus.agent.health")

XID_KEPT = 120.0  # seconds an XID event stays in the reports: the control plane sees it even if a report is lost
# XIDs that mean the GPU needs a reset or a replacement (NVIDIA's XID catalogue): 48 DBE ECC, 63/64 page retirement
# or row remap events, 74 NVLink, 79 fallen off the bus, 92 high single-bit ECC rate, 94/95 contained/uncontained
# ECC, 119/120 GSP errors. Others (13 graphics engine exception, 31 MMU fault, 43 stopped) are usually the
# application's: reported, not fatal.
FATAL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})


def first_line(output: str) -> str:
    """The first non-empty line of a command's output, trimmed (what a failed health check's drain says)."""
    return next((ln.strip() for ln in output.splitlines() if ln.strip()), "")[:500]


def run_health_check(command: str, timeout: float) -> P.HealthCheck:
    """Run the site health check once: `sh -c command`, its stdout and stderr together."""
    try:
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return P.HealthCheck(ok=False, output=f"health check timed out after {timeout:g}s")
    except OSError as e:
        return P.HealthCheck(ok=False, output=f"health check could not run: {e}")
    if done.returncode == 0:
        return P.HealthCheck(ok=True, output=first_line(done.stdout))
    out = first_line(done.stdout + "\n" + done.stderr) or f"health check failed (exit {done.returncode})"
    return P.HealthCheck(ok=False, output=out)


class NvmlHealth:
    """Reads the GPUs' faults from NVML (the module's docstring says which calls); None from `open` without NVML."""

    def __init__(self, pynvml, count: int):
        self.nv = pynvml
        self.count = count
        self.xids: dict[int, tuple[int, float]] = {}  # GPU -> (last XID, when seen)
        self.events = None
        try:
            self.events = pynvml.nvmlEventSetCreate()
            for i in range(count):
                try:
                    pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(i),
                                                    pynvml.nvmlEventTypeXidCriticalError, self.events)
                except pynvml.NVMLError as e:  # not supported on this GPU: the polled checks still run
                    log.info("GPU %d: no XID events (%s)", i, e)
        except pynvml.NVMLError as e:
            log.info("no NVML event set (%s): XIDs are not watched", e)

    @classmethod
    def open(cls, count: int) -> NvmlHealth | None:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # noqa: BLE001 - no library, no driver: no NVML health
            return None
        return cls(pynvml, count)

    def wait_xids(self, timeout_ms: int) -> None:
        """Take the XID events that arrive within `timeout_ms`."""
        if self.events is None:
            time.sleep(timeout_ms / 1000)
            return
        nv = self.nv
        while True:
            try:
                data = nv.nvmlEventSetWait(self.events, timeout_ms)
            except nv.NVMLError:  # NVML_ERROR_TIMEOUT: nothing happened
                return
            idx = self._index_of(data.device)
            if idx is not None:
                self.xids[idx] = (int(data.eventData), time.time())
                log.warning("GPU %d: XID %d", idx, int(data.eventData))
            timeout_ms = 0

    def _index_of(self, handle) -> int | None:
        try:
            return int(self.nv.nvmlDeviceGetIndex(handle))
        except self.nv.NVMLError:
            return None

    def faults(self) -> list[P.GpuFault]:
        nv, out, now = self.nv, [], time.time()
        for i in range(self.count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                out += self._gpu_faults(i, h)
            except nv.NVMLError as e:
                out.append(P.GpuFault(index=i, what=f"not answering ({e})"[:200]))
                continue
            xid = self.xids.get(i)
            if xid and now - xid[1] < XID_KEPT:
                out.append(P.GpuFault(index=i, what=f"XID {xid[0]}", xid=xid[0], fatal=xid[0] in FATAL_XIDS))
        return out

    def _gpu_faults(self, i: int, h) -> list[P.GpuFault]:
        nv, out = self.nv, []

        def optional(call, *args):  # a query this GPU does not support (or allow) says nothing; a lost GPU raises
            try:
                return call(h, *args)
            except nv.NVMLError_GpuIsLost:
                raise
            except nv.NVMLError:
                return None

        ecc = optional(nv.nvmlDeviceGetTotalEccErrors, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
        if ecc:
            out.append(P.GpuFault(index=i, what=f"uncorrectable ECC errors ({int(ecc)})"))
        pending = optional(nv.nvmlDeviceGetRetiredPagesPendingStatus)
        if pending:
            out.append(P.GpuFault(index=i, what="retired pages pending (needs a reset)"))
        rows = optional(nv.nvmlDeviceGetRemappedRows)  # (corrected, uncorrected, pending, failure)
        if rows and rows[3]:
            out.append(P.GpuFault(index=i, what="row remapping failed"))
        elif rows and rows[2]:
            out.append(P.GpuFault(index=i, what="row remap pending (needs a reset)"))
        reasons = optional(nv.nvmlDeviceGetCurrentClocksThrottleReasons)
        slow = [w for bit, w in ((getattr(nv, "nvmlClocksThrottleReasonHwThermalSlowdown", 0x40), "HW thermal"),
                                 (getattr(nv, "nvmlClocksThrottleReasonSwThermalSlowdown", 0x20), "SW thermal"),
                                 (getattr(nv, "nvmlClocksThrottleReasonHwPowerBrakeSlowdown", 0x80), "power brake"))
                if reasons and reasons & bit]
        if slow:
            out.append(P.GpuFault(index=i, what=f"{', '.join(slow)} slowdown", fatal=False))
        return out


class HealthWatch:
    """The agent's thread that keeps `faults` and `check` current and wakes the report when they change."""

    def __init__(self, gpus: int, nvml: bool, command: str | None, interval: float, on_change):
        self.command, self.interval, self.on_change = command, interval, on_change
        self.nvml = NvmlHealth.open(gpus) if nvml else None
        self.faults: list[P.GpuFault] | None = [] if self.nvml else None
        self.check: P.HealthCheck | None = None
        self.stopping = threading.Event()

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.loop, name="agent-health", daemon=True)
        t.start()
        return t

    def loop(self) -> None:
        next_check = 0.0
        while not self.stopping.is_set():
            if self.command and time.monotonic() >= next_check:
                check = run_health_check(self.command, self.interval)
                next_check = time.monotonic() + self.interval
                if check != self.check:
                    if not check.ok:
                        log.warning("health check failed: %s", check.output)
                    self.check = check
                    self.on_change()
            if self.nvml is not None:
                self.nvml.wait_xids(1000)
                faults = self.nvml.faults()
                if faults != self.faults:
                    self.faults = faults
                    self.on_change()
            else:
                self.stopping.wait(min(1.0, self.interval))
