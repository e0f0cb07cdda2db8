"""Test tiers: unmarked tests are ``unit``; ``distributed`` tests start real DeepSpeed ranks on
gloo; ``gpu`` tests are skipped on machines without CUDA (checked without importing torch at
collection time when possible)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

import pytest


def _has_cuda_gpu() -> bool:
    if os.environ.get("DSTK_TEST_GPU") == "0":
        return False
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def pytest_collection_modifyitems(config, items):
    tiers = {"distributed", "gpu", "slow"}
    have_gpu = None
    for item in items:
        names = {m.name for m in item.iter_markers()}
        if not names & tiers:
            item.add_marker(pytest.mark.unit)
        if "gpu" in names:
            if have_gpu is None:
                have_gpu = _has_cuda_gpu()
            if not have_gpu:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


@pytest.fixture
def free_port() -> int:
    """A TCP port the OS just gave us (tests run side by side; never a fixed port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SHM_DIR = "/dev/shm"
SHM_PREFIX = "deepspeed_allreduce_buffer"
"""DeepSpeed's CPU shm all-reduce (ops/csrc/cpu/comm/shm.cpp) shm_open()s a 66 MiB buffer per rank
and never unlinks it on a normal exit: every 2-rank run here leaks ~132 MiB into /dev/shm, and a
full suite run leaked gigabytes until the kernel's OOM killer stopped pytest."""


def remove_stale_shm_buffers() -> int:
    """Remove DeepSpeed shm buffers no live process maps or holds open; return how many."""
    from dstk.launch.shm import in_use_paths  # open counts too: see its module docstring
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(SHM_PREFIX)]
    except OSError:
        return 0
    if not names:
        return 0
    mapped = in_use_paths(needle=SHM_PREFIX)
    removed = 0
    for name in names:
        path = os.path.join(SHM_DIR, name)
        if path not in mapped:
            try:
                os.unlink(path)
                removed += 1
            except OSError:
                pass
    return removed


@pytest.fixture(autouse=True)
def _clean_deepspeed_shm():
    yield
    remove_stale_shm_buffers()  # a directory listing when there is nothing to remove


def pytest_sessionstart(session):
    remove_stale_shm_buffers()
