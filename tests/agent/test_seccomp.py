"""One definition of what a worker may not ask the kernel (astraeus.agent.runtime.seccomp): runc's profile for a
container and the BPF program both process-runtime supervisors install say the same, on x86_64 and aarch64. The
program is run here by a small classic-BPF interpreter for each architecture; what a real worker gets from either
supervisor is tests/agent/test_native_shim.py's and tests/faults/test_hostile_tenant.py's."""

from __future__ import annotations

import struct

import pytest

from astraeus.agent.runtime import oci_spec, seccomp

ALLOW, KILL = 0x7FFF0000, 0x80000000
EPERM, ENOSYS = 0x00050000 | 1, 0x00050000 | 38
CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x40000000, 17
# a few calls every worker makes: read, write, openat, mmap, futex, execve, exit_group, wait4
ORDINARY = {"x86_64": [0, 1, 257, 9, 202, 59, 231, 61], "aarch64": [63, 64, 56, 222, 98, 221, 94, 260]}


def run_bpf(prog: bytes, nr: int, arch: int, arg0: int = 0) -> int:
    """What the kernel's seccomp would answer for this call (the classic BPF subset seccomp.program uses)."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    ins = [struct.unpack_from("=HBBI", prog, i) for i in range(0, len(prog), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = ins[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code in (0x15, 0x35, 0x45):  # jeq, jge, jset
            hit = acc == k if code == 0x15 else acc >= k if code == 0x35 else bool(acc & k)
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:  # ret k
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_process_runtimes_filter_refuses_what_runcs_profile_refuses(machine):
    prog = seccomp.program(machine)
    assert prog is not None and len(prog) % 8 == 0
    arch, nrs = seccomp.AUDIT_ARCH[machine], seccomp.NUMBERS[machine]
    profile = oci_spec.seccomp_profile()
    denied = profile["syscalls"][0]["names"]
    assert denied == list(seccomp.DENIED) == oci_spec.SECCOMP_DENIED
    missing = {n for n in denied if n not in nrs}
    assert missing == ({"iopl", "ioperm"} if machine == "aarch64" else set())  # x86-only calls
    for name in denied:
        if name in nrs:
            assert run_bpf(prog, nrs[name], arch) == EPERM, name
    for nr in ORDINARY[machine]:
        assert run_bpf(prog, nr, arch) == ALLOW, nr
    # clone: a fork or a thread is allowed, a new namespace of any kind is not; clone3 falls back to clone
    assert run_bpf(prog, nrs["clone"], arch, SIGCHLD) == ALLOW
    assert run_bpf(prog, nrs["clone"], arch, 0x3D0F00) == ALLOW  # pthread_create's flags
    for flag in seccomp.CLONE_NAMESPACE_FLAGS:
        assert run_bpf(prog, nrs["clone"], arch, flag | SIGCHLD) == EPERM, hex(flag)
    assert run_bpf(prog, nrs["clone"], arch, CLONE_NEWUSER | CLONE_NEWNET | SIGCHLD | (1 << 40)) == EPERM
    assert run_bpf(prog, nrs["clone3"], arch) == ENOSYS
    rules = [r for r in profile["syscalls"] if r["names"] == ["clone"]]
    assert sorted(r["args"][0]["value"] for r in rules) == sorted(seccomp.CLONE_NAMESPACE_FLAGS)
    # another architecture's numbers (a 32-bit program) are not let through
    assert run_bpf(prog, nrs["unshare"], 0x40000003) == KILL  # AUDIT_ARCH_I386
    if machine == "x86_64":
        assert run_bpf(prog, 0x40000000 | nrs["unshare"], arch) == ENOSYS  # x32


def test_a_machine_whose_numbers_are_not_known_gets_no_program():
    assert seccomp.program("riscv64") is None
