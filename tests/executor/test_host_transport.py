"""The host transport's process-local pieces (cc/sync/host_rendezvous.cc): the arena and
what attaching refuses. Processes meeting through it are tested by
tests/multiprocess/test_multiprocess.py."""

import fcntl
import os
import subprocess
import sys

import pytest

from jax_blink import _ffi


@pytest.fixture(scope="module")
def ext():
    return _ffi.load_extension()


def test_the_arena_is_an_anonymous_close_on_exec_memory_file(ext):
    pid, fd = ext.host_arena()
    assert pid == os.getpid()
    assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC  # a child it starts holds none
    target = os.readlink(f"/proc/self/fd/{fd}")
    assert target.startswith("/memfd:jax_blink_arena"), target  # never named in /dev/shm
    assert ext.host_arena() == (pid, fd)  # one per process


def test_attach_refuses_a_list_without_this_process(ext):
    pid, fd = ext.host_arena()
    with pytest.raises(RuntimeError, match=r"this process is not processes\[slot\]"):
        ext.host_attach(1, [(pid, fd), (pid, fd + 1000)])
    with pytest.raises(RuntimeError, match=r"this process is not processes\[slot\]"):
        ext.host_attach(2, [(pid, fd)])
    assert not ext.host_attached()  # (an attach that succeeded would stay for the session)


def test_attach_refuses_a_process_that_is_gone_or_a_file_that_is_no_arena(ext, tmp_path):
    pid, fd = ext.host_arena()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid that no longer exists
    with pytest.raises(RuntimeError, match=r"cannot open the arena of process 1 of this host"):
        ext.host_attach(0, [(pid, fd), (child.pid, 3)])
    with open(tmp_path / "small", "wb") as f:  # mapping a short file would fault: refused
        f.write(b"x" * 4096)
        f.flush()
        with pytest.raises(RuntimeError, match="is not a jax_blink arena"):
            ext.host_attach(0, [(pid, fd), (os.getpid(), f.fileno())])
    assert not ext.host_attached()
