"""DeepSpeed's own verdict on configs: ``DeepSpeedConfig`` at a target data-parallel size.

This is the only part of ``dstk.validate`` that imports deepspeed (and, with ``fill_hf``,
transformers). It runs in a child process (``python -m dstk.validate.deepspeed_check``) so that
DeepSpeed's logging, its 3.5 s import and its process group stay out of the caller.

DeepSpeedConfig ignores its ``mpu`` unless ``deepspeed.comm`` is initialised (``runtime/config.py:455-474``:
``dist.get_rank()`` fails, so it parses at world size 1), so for a data-parallel size above 1 the child
starts a 1-rank gloo group and passes an mpu that reports that size (/work/shared/ENVIRONMENT.md). At size
1 it starts no group: ``deepspeed.init_distributed`` builds the ``deepspeed_shm_comm`` op on the CPU
accelerator (``comm/torch.py`` ``build_shm_op``; minutes on a cold cache), which the parse does not need.
A job with ``fill`` has its ``"auto"`` values filled by transformers' own ``HfTrainerDeepSpeedConfig`` with
default ``TrainingArguments`` first (``hf_fill``: any values, for tests that only need DeepSpeed to parse an HF
file). ``dstk validate --hf --deepspeed`` does not use it: it fills with ``dstk.validate.training_args.fill_auto``
from what the user gave, and hands over the filled dict.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Verdict:
    accepted: bool
    """Whether ``DeepSpeedConfig`` parsed the config."""
    error: str | None = None
    """``ExceptionType: message`` when it did not."""


class _MPU:
    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self):
        return self.dp

    def get_data_parallel_rank(self):
        return 0

    def get_model_parallel_world_size(self):
        return 1

    def get_model_parallel_rank(self):
        return 0


def _init_group() -> None:
    import torch.distributed

    import deepspeed

    if torch.distributed.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port)).items():
        os.environ[key] = value
    deepspeed.init_distributed(dist_backend="gloo")


def hf_fill(config: dict, *, hidden_size: int = 64, num_training_steps: int = 100) -> dict:
    """Fill ``"auto"`` the way transformers' Trainer does, with default ``TrainingArguments``, a made-up hidden size
    and step count: for a parse that needs some values, never for a report (see ``training_args.fill_auto``)."""
    import types

    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, report_to=[], bf16=bool(_enabled(config, "bf16")),
                                 fp16=bool(_enabled(config, "fp16")) and not _enabled(config, "bf16"),
                                 use_cpu=True)
        hf = HfTrainerDeepSpeedConfig(copy.deepcopy(config))
        hf.trainer_config_process(args)
        model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=hidden_size))
        hf.trainer_config_finalize(args, model, num_training_steps)
        return hf.config


def _enabled(config, section):
    value = config.get(section, {})
    return isinstance(value, dict) and value.get("enabled") is True


def parse_in_process(config: dict | str, *, dp: int = 1, fill: bool = False) -> Verdict:
    """Run DeepSpeedConfig here (imports deepspeed; starts a 1-rank gloo group once, only for ``dp > 1``).
    ``config`` is a dict or a file path (DeepSpeed then reads the file itself, with hjson and its duplicate-key
    check)."""
    from deepspeed.runtime.config import DeepSpeedConfig

    if dp > 1:  # only then does DeepSpeedConfig need deepspeed.comm (to ask the mpu for the size)
        _init_group()
    try:
        if isinstance(config, str):
            cfg = config
        else:
            cfg = hf_fill(config) if fill else copy.deepcopy(config)
        DeepSpeedConfig(cfg, mpu=_MPU(dp))
    except Exception as exc:  # DeepSpeed raises assert/Type/Value/pydantic errors: all are its verdict
        text = " ".join(str(exc).split())
        return Verdict(accepted=False, error=f"{type(exc).__name__}: {text[:500]}")
    return Verdict(accepted=True)


def parse_many(jobs: list[dict], *, timeout: float = 300) -> list[Verdict]:
    """DeepSpeed's verdict on each ``{"config": dict | path, "dp": int, "fill": bool}``, in one child process."""
    if not jobs:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.json")
        with open(src, "w") as fh:
            json.dump(jobs, fh)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(key, None)
        proc = subprocess.run([sys.executable, "-m", "dstk.validate.deepspeed_check", src, dst], env=env,
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not os.path.exists(dst):
            tail = (proc.stderr or proc.stdout)[-2000:]
            raise RuntimeError(f"the DeepSpeed parse process failed (exit {proc.returncode}): {tail}")
        with open(dst) as fh:
            return [Verdict(**v) for v in json.load(fh)]


def main(argv: list[str]) -> int:
    src, dst = argv
    with open(src) as fh:
        jobs = json.load(fh)
    verdicts = [dataclasses.asdict(parse_in_process(j["config"], dp=j.get("dp", 1), fill=j.get("fill", False)))
                for j in jobs]
    with open(dst, "w") as fh:
        json.dump(verdicts, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
