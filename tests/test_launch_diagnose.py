"""``dstk.launch.diagnose``: the cause of a failed run, named from the ranks' output with a fix.

The CPU-provokable failures (host OOM, a taken rendezvous port, SIGKILL) are real runs in
tests/test_launch_distributed.py; the GPU-only ones are log excerpts written here in the exact
formats torch, NCCL and DeepSpeed print them."""

from __future__ import annotations

import signal

import pytest

from dstk.launch.diagnose import diagnose

CUDA_OOM = ("[rank 3] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.86 GiB. GPU 3 has a total "
            "capacity of 79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has "
            "78.12 GiB memory in use.")
NCCL_WATCHDOG = ("[rank 5] [rank5]:[E1203 04:12:55.123456 1234 ProcessGroupNCCL.cpp:632] [Rank 5] Watchdog caught "
                 "collective operation timeout: WorkNCCL(SeqNum=2345, OpType=ALLREDUCE, NumelIn=262144000, "
                 "NumelOut=262144000, Timeout(ms)=1800000) ran for 1800034 milliseconds before timing out.")
OP_BUILD = ["[rank 0] ninja: build stopped: subcommand failed.",
            "[rank 0] RuntimeError: Error building extension 'fused_adam'"]
UNREACHABLE = ("[rank 9] torch.distributed.DistNetworkError: The client socket has timed out after 1800000ms while "
               "trying to connect to (10.1.2.3, 29500).")
SHM = "[rank 2] ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm)."
PORT = ("[rank 0] torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
        "address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")

# A CPU rank aborted by torch's gloo backend at interpreter exit, as the CI run of 58b4c65 printed it.
EXIT_ABORT = "[rank 1] terminate called without an active exception"

PLAN = {
    "cluster": {"usable_bytes": 72 * 2**30},
    "memory": {"per_gpu": {"total_bytes": 70 * 2**30}, "cpu_bytes": 0},
    "alternatives": [
        {"layout": {"dp": 8, "zero_stage": 3, "micro_batch": 1, "grad_accum": 8}, "total_bytes": 40 * 2**30},
        {"layout": {"dp": 8, "zero_stage": 2, "micro_batch": 2, "grad_accum": 4}, "total_bytes": 75 * 2**30},
    ],
}


@pytest.mark.parametrize("lines,code,fix_says", [
    ([CUDA_OOM], "gpu-oom", "--headroom"),
    ([NCCL_WATCHDOG], "nccl-timeout", "NCCL_DEBUG=INFO"),
    (OP_BUILD, "op-build", "torch_adam"),
    ([UNREACHABLE], "master-unreachable", "--master-addr"),
    ([SHM], "bus-error", "--shm-size"),
    ([PORT], "port-in-use", "--master-port"),
    ([EXIT_ABORT], "exit-abort", "exit_rank()"),
])
def test_each_failure_is_named_with_its_fix(lines, code, fix_says):
    noise = ["[rank 0] step 10 loss 2.31", "[rank 1] Traceback (most recent call last):"]
    found = diagnose(noise + lines + noise)
    assert [d.code for d in found] == [code]
    assert fix_says in found[0].fix
    assert found[0].line in lines


def test_gpu_oom_names_the_plans_estimate_and_the_smaller_layouts():
    (found,) = diagnose([CUDA_OOM], plan=PLAN)
    assert "70.0 GiB per GPU of 72.0 GiB usable" in found.cause
    assert "dp=8 ZeRO-3" in found.fix and "(40.0 GiB)" in found.fix
    assert "ZeRO-2" not in found.fix.split("need less:")[1]  # 75 GiB is not smaller


def test_a_clean_log_names_nothing_and_signals_are_read():
    assert diagnose(["[rank 0] step 1 loss 3.0", "[rank 0] done"]) == []
    assert [d.code for d in diagnose([], signals=(signal.SIGKILL,))] == ["killed"]
    assert [d.code for d in diagnose([], signals=(signal.SIGSEGV, signal.SIGSEGV))] == ["segfault"]
    # an OOM that ends in SIGKILL is the OOM, not the OOM killer
    assert [d.code for d in diagnose([CUDA_OOM], signals=(signal.SIGKILL,))] == ["gpu-oom"]
