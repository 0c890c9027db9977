"""Reads without io_uring. When the kernel refuses the ring - switched off by the sysctl
``kernel.io_uring_disabled``, or blocked by a seccomp filter as container runtimes install -
readers fall back to pread by themselves, say why (once, in the log), report it (``read
--json``'s ``backend_fallback``, ``Stream.backend_fallback``, ``io_backends()``, ``granary
--version``), and every epoch is whole and right: the same samples and digest as with io_uring.
"""

import ctypes
import json
import os
import platform
import struct
import subprocess
import sys

import pytest

import granary
from conftest import granary_bin

SYSCTL = "/proc/sys/kernel/io_uring_disabled"


def read_json(path, *extra, **kw):
    """`granary read PATH --io direct --json` (direct reads: the default backend wants
    io_uring for them) - the epochs and what the command said on stderr."""
    p = subprocess.run([granary_bin(), "read", str(path), "--io", "direct", "--json", "--seed",
                        "3", "--epochs", "2", *extra], capture_output=True, text=True, **kw)
    return p


def epochs_of(p):
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture
def uring_switched_off():
    """kernel.io_uring_disabled = 2 for the test's duration (as root), restored after."""
    if not os.path.exists(SYSCTL):
        pytest.skip(f"this kernel has no {SYSCTL}")
    if not os.access(SYSCTL, os.W_OK):
        pytest.skip(f"setting {SYSCTL} needs root")
    with open(SYSCTL) as f:
        before = f.read().strip()
    with open(SYSCTL, "w") as f:
        f.write("2")
    try:
        yield
    finally:
        with open(SYSCTL, "w") as f:
            f.write(before)


def test_the_sysctl_switching_io_uring_off_falls_back_to_pread_visibly(packed, uring_switched_off):
    path, files = packed
    p = read_json(path)
    eps = epochs_of(p)
    assert [e["backend"] for e in eps] == ["pread", "pread"]
    for e in eps:
        assert e["samples"] == len(files)
        assert "kernel.io_uring_disabled = 2" in e["backend_fallback"], e["backend_fallback"]
    # Said once (a process reads two epochs: one line), naming the reason.
    said = [l for l in p.stderr.splitlines() if "reading with pread instead" in l]
    assert len(said) == 1 and "io_uring_disabled" in said[0], p.stderr
    forced = epochs_of(read_json(path, "--backend", "pread"))
    assert [e["digest"] for e in eps] == [e["digest"] for e in forced]
    assert all(e["backend_fallback"] is None for e in forced)
    # Asked for by name, io_uring is an error that says why and what to do, not a fallback.
    p = read_json(path, "--backend", "uring")
    assert p.returncode != 0
    assert "io_uring_disabled = 2" in p.stderr and "auto" in p.stderr, p.stderr
    v = subprocess.run([granary_bin(), "--version"], capture_output=True, text=True, check=True)
    assert "io_uring: no: io_uring is switched off" in v.stdout, v.stdout
    # Python in a new process (the probe is made once per process) says the same.
    code = ("import granary, sys; b = granary.io_backends(); "
            "s = granary.Stream(sys.argv[1], 3, 0, 1, 0, 1, io='direct'); "
            "n = sum(1 for _ in s); "
            "print(b['io_uring'], s.backend, n, s.backend_fallback)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, check=True).stdout.split(" ", 3)
    assert out[:3] == ["False", "pread", str(len(files))], out
    assert "io_uring_disabled = 2" in out[3]


def test_with_io_uring_the_same_epochs(packed):
    if granary.io_backends()["io_uring"] is False:
        pytest.skip(f"io_uring is off here: {granary.io_backends()['io_uring_unavailable']}")
    path, files = packed
    eps = epochs_of(read_json(path))
    assert [e["backend"] for e in eps] == ["uring", "uring"]
    assert all(e["backend_fallback"] is None for e in eps)
    forced = epochs_of(read_json(path, "--backend", "pread"))
    assert [e["digest"] for e in eps] == [e["digest"] for e in forced]
    s = granary.Stream(str(path), 3, 0, 1, 0, 1, io="direct")
    assert sum(1 for _ in s) == len(files)
    assert s.backend == "uring" and s.backend_fallback is None


# A seccomp filter that makes io_uring_setup fail with EPERM, as Docker's default profile
# does, installed in the child between fork and exec (classic BPF, struct seccomp_data: the
# architecture at offset 4, the system call number at 0).
_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_IO_URING_SETUP = 425  # the same number on both
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_RET_K = 0x20, 0x15, 0x06
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO, _EPERM = 0x7FFF0000, 0x00050000, 1
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2


def _deny_io_uring():
    arch = _ARCH[platform.machine()]

    def insn(code, jt, jf, k):
        return struct.pack("HBBI", code, jt, jf, k)

    prog = b"".join([
        insn(_BPF_LD_W_ABS, 0, 0, 4),
        insn(_BPF_JEQ_K, 1, 0, arch),
        insn(_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW),  # another ABI: not ours to judge
        insn(_BPF_LD_W_ABS, 0, 0, 0),
        insn(_BPF_JEQ_K, 0, 1, _IO_URING_SETUP),
        insn(_BPF_RET_K, 0, 0, _SECCOMP_RET_ERRNO | _EPERM),
        insn(_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW),
    ])
    buf = ctypes.create_string_buffer(prog)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(prog) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


@pytest.mark.skipif(platform.machine() not in _ARCH, reason="no seccomp filter for this CPU")
def test_a_seccomp_filter_blocking_io_uring_falls_back_to_pread(packed):
    path, files = packed
    p = read_json(path, preexec_fn=_deny_io_uring)
    eps = epochs_of(p)
    assert [e["backend"] for e in eps] == ["pread", "pread"]
    for e in eps:
        assert e["samples"] == len(files)
        assert "seccomp" in e["backend_fallback"] or "io_uring_disabled" in e["backend_fallback"]
    forced = epochs_of(read_json(path, "--backend", "pread"))
    assert [e["digest"] for e in eps] == [e["digest"] for e in forced]
    code = ("import granary, sys; s = granary.Stream(sys.argv[1], 3, 0, 1, 0, 1, "
            "io='direct'); n = sum(1 for _ in s); print(s.backend, n)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, check=True, preexec_fn=_deny_io_uring).stdout.split()
    assert out == ["pread", str(len(files))], out


def test_the_wheel_installs_the_command_of_the_same_version():
    cli = os.path.join(os.path.dirname(sys.executable), "granary")
    if not os.path.exists(cli):
        pytest.skip("no granary command beside this Python: the package was not installed from "
                    "its wheel")
    out = subprocess.run([cli, "--version"], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == f"granary {granary.__version__}", out
    assert lines[1].startswith("format: 2.0"), out
    assert any(l.startswith("io_uring: ") for l in lines), out
