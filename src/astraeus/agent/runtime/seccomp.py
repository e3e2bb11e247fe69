"""The one definition of the system calls a worker may not make, for both runtimes (stdlib only: the shims import
it). The container runtime gives it to runc as an OCI seccomp profile (oci_spec.seccomp_profile); the process
runtime's supervisors install it in the worker's PID 1 before the command starts (after no_new_privs), as the
classic BPF program built here: the Python shim with prctl(PR_SET_SECCOMP) through ctypes (install), the C
supervisor (shim_native.c) from the same program's bytes, which the launcher hands it in its plan
(astraeus.agent.runtime.native), so the two supervisors cannot drift apart.

What it refuses, as Docker's default profile does for a container without CAP_SYS_ADMIN: new namespaces (user
namespaces above all, which would give a hostile worker capabilities over namespaces of its own: `unshare`,
`setns`, and `clone` with any namespace flag), mounts, keyrings, BPF, perf events, kernel modules, clocks,
reboot, swap (EPERM); `clone3` answers ENOSYS, so that the C library falls back to `clone`, whose flags a
filter can read. Everything else is allowed.

The BPF program knows the numbers of these calls on x86_64 and aarch64 and checks the audit architecture: a
system call of another one (a 32-bit i386 or arm program, which has other numbers) kills the process, and x32
calls on x86_64 answer ENOSYS. On any other machine there is no program (program() is None) and the worker runs
without the filter (its supervisor logs so).
"""

from __future__ import annotations

import os
import struct

# The denied calls (EPERM), by name: the OCI profile names them, the BPF program numbers them (NUMBERS).
DENIED = ("unshare", "setns", "mount", "umount2", "pivot_root", "keyctl", "add_key", "request_key", "bpf",
          "perf_event_open", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
          "open_by_handle_at", "name_to_handle_at", "userfaultfd", "swapon", "swapoff", "reboot", "syslog", "acct",
          "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm", "lookup_dcookie",
          "quotactl", "fsopen", "fsmount", "fsconfig", "fspick", "move_mount", "open_tree", "mount_setattr")
# clone() with any of these flags is refused (EPERM): CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
EPERM, ENOSYS = 1, 38

# The OCI (libseccomp) names of the architectures runc's profile covers
OCI_ARCHITECTURES = ("SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32", "SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM")

# System call numbers (the kernel's arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h);
# a name a machine does not have (iopl, ioperm on aarch64) is not there to refuse.
NUMBERS: dict[str, dict[str, int]] = {
    "x86_64": {
        "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "keyctl": 250, "add_key": 248,
        "request_key": 249, "bpf": 321, "perf_event_open": 298, "kexec_load": 246, "kexec_file_load": 320,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "open_by_handle_at": 304,
        "name_to_handle_at": 303, "userfaultfd": 323, "swapon": 167, "swapoff": 168, "reboot": 169, "syslog": 103,
        "acct": 163, "settimeofday": 164, "clock_settime": 227, "clock_adjtime": 305, "adjtimex": 159, "iopl": 172,
        "ioperm": 173, "lookup_dcookie": 212, "quotactl": 179, "fsopen": 430, "fsmount": 432, "fsconfig": 431,
        "fspick": 433, "move_mount": 429, "open_tree": 428, "mount_setattr": 442, "clone": 56, "clone3": 435},
    "aarch64": {
        "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "keyctl": 219, "add_key": 217,
        "request_key": 218, "bpf": 280, "perf_event_open": 241, "kexec_load": 104, "kexec_file_load": 294,
        "init_module": 105, "finit_module": 273, "delete_module": 106, "open_by_handle_at": 265,
        "name_to_handle_at": 264, "userfaultfd": 282, "swapon": 224, "swapoff": 225, "reboot": 142, "syslog": 116,
        "acct": 89, "settimeofday": 170, "clock_settime": 112, "clock_adjtime": 266, "adjtimex": 171,
        "lookup_dcookie": 18, "quotactl": 60, "fsopen": 430, "fsmount": 432, "fsconfig": 431, "fspick": 433,
        "move_mount": 429, "open_tree": 428, "mount_setattr": 442, "clone": 220, "clone3": 435},
}
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000

# classic BPF (linux/filter.h, linux/seccomp.h)
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_ERRNO, _RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (the low half of args[0] first
# on these little-endian machines; every namespace flag is in it)
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2


def oci_profile() -> dict:
    """The same refusals as an OCI seccomp profile (runc's config.json `linux.seccomp`): allow by default; EPERM
    for DENIED and for clone() asking for a new namespace (one rule per flag, (flags & flag) == flag: rules are
    or-ed, a rule's args and-ed); clone3 ENOSYS."""
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": list(OCI_ARCHITECTURES),
        "syscalls": [
            {"names": list(DENIED), "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM},
            *({"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM,
               "args": [{"index": 0, "value": bit, "valueTwo": bit, "op": "SCMP_CMP_MASKED_EQ"}]}
              for bit in CLONE_NAMESPACE_FLAGS),
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS},
        ],
    }


def program(machine: str | None = None) -> bytes | None:
    """The BPF program (struct sock_filter[], native byte order) of this machine (`machine`: os.uname().machine),
    or None where its system call numbers are not known here."""
    machine = machine or os.uname().machine
    nrs = NUMBERS.get(machine)
    if nrs is None:
        return None
    denied = sorted({nrs[n] for n in DENIED if n in nrs})
    ns_mask = 0
    for bit in CLONE_NAMESPACE_FLAGS:
        ns_mask |= bit
    ins: list[tuple[int, int, int, int]] = []  # (code, jt, jf, k); jumps fixed up below against labels
    fix: list[tuple[int, str, str | None]] = []  # (index, label when true, label when false)

    def add(code: int, k: int, jt: str | None = None, jf: str | None = None) -> None:
        if jt or jf:
            fix.append((len(ins), jt, jf))
        ins.append((code, 0, 0, k))

    add(_LD_W_ABS, _OFF_ARCH)
    add(_JEQ_K, AUDIT_ARCH[machine], jf="kill")
    add(_LD_W_ABS, _OFF_NR)
    if machine == "x86_64":
        add(_JGE_K, X32_SYSCALL_BIT, jt="enosys")
    for nr in denied:
        add(_JEQ_K, nr, jt="eperm")
    add(_JEQ_K, nrs["clone3"], jt="enosys")
    add(_JEQ_K, nrs["clone"], jf="allow")
    add(_LD_W_ABS, _OFF_ARG0)
    add(_JSET_K, ns_mask, jt="eperm")
    labels = {"allow": len(ins)}
    add(_RET_K, _RET_ALLOW)
    labels["eperm"] = len(ins)
    add(_RET_K, _RET_ERRNO | EPERM)
    labels["enosys"] = len(ins)
    add(_RET_K, _RET_ERRNO | ENOSYS)
    labels["kill"] = len(ins)
    add(_RET_K, _RET_KILL_PROCESS)
    for i, jt, jf in fix:
        code, _, _, k = ins[i]
        t = labels[jt] - i - 1 if jt else 0
        f = labels[jf] - i - 1 if jf else 0
        assert 0 <= t < 256 and 0 <= f < 256
        ins[i] = (code, t, f, k)
    return b"".join(struct.pack("=HBBI", *i) for i in ins)


def install(prog: bytes) -> None:
    """Install `prog` (program()) on this thread's process, for it and every process it starts: after no_new_privs
    (or with CAP_SYS_ADMIN). Raises OSError."""
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = SockFprog(len(prog) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"cannot install the seccomp filter: {os.strerror(e)}")
