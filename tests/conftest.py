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
