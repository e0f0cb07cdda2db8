"""On a CUDA machine: `dstk doctor` over NCCL and a 1-GPU NCCL launch of a real DeepSpeed step.

Skipped without a GPU (tests/conftest.py). Run as one prepared script where a GPU is lent:
    .venv/bin/python -m pytest -q -m gpu tests/test_launch_gpu.py -s
"""

from __future__ import annotations

import json
import re

import pytest

from tests.test_launch import write_run_dir
from tests.test_launch_distributed import SCRIPTS, dstk, finish

pytestmark = pytest.mark.gpu


def test_doctor_over_nccl_on_one_gpu():
    rc, out, err = finish(dstk("doctor", "--num-ranks", "1", "--sizes", "8M,64M", "--format", "json"), timeout=300)
    print(out)
    assert rc == 0, err[-3000:]
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["versions@localhost"]["data"]["accelerator"] == "cuda"
    assert checks["versions@localhost"]["data"]["nccl"]
    results = checks["allreduce"]["data"]["results"]
    assert all(r["backend"] == "nccl" and r["correct"] and r["algbw_bytes_per_s"] > 0 for r in results)


def test_one_gpu_nccl_launch_trains_a_step(tmp_path):
    run_dir = write_run_dir(tmp_path / "run", num_nodes=1, gpus_per_node=1, gpu="h200")
    (run_dir / "ds_config.json").write_text(json.dumps({
        "train_batch_size": 4, "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}}}))
    rc, out, err = finish(dstk("launch", str(run_dir), "--nccl-profile", "single-node", "--",
                               str(SCRIPTS / "train_step.py")), timeout=300)
    print(out[-2000:])
    assert rc == 0, err[-3000:]
    assert re.search(r"^\[rank 0\] STEP rank=0 world=1 node=0 backend=nccl loss=\S+ changed=True same=True$", out, re.M)
