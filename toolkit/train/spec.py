"""What the parent hands each rank: one JSON file, written before the launch."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from dstk.train.lora import LoraSettings


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class TrainSpec:
    """Everything a rank needs; the parent has already checked and prepared it."""

    output_dir: str
    """Run output: checkpoints/, logs/ (launch.log, metrics), model/ (the HF export), prepared/ (data, tokenizer)."""
    ds_config: str
    """The effective DeepSpeed config (the plan's, plus the csv monitor and the step count)."""
    model_source: str
    """An HF directory holding at least config.json; weights are loaded when ``pretrained``."""
    pretrained: bool
    """Load weights from ``model_source`` (False: random init from its config, seeded)."""
    tokenizer_dir: str
    train_blocks: str
    """A torch file with a LongTensor [num_blocks, seq_len] of packed token ids."""
    eval_blocks: str | None
    num_steps: int
    seed: int = 0
    tp: int = 1
    pp: int = 1
    world_size: int
    precision: str = "fp32"
    save_every: int = 0
    """Checkpoint every N optimizer steps (0: only at the end)."""
    eval_every: int = 0
    log_every: int = 1
    resume: bool = False
    trainer: str = "native"
    """``native`` (the DeepSpeed engine loop, ``dstk.train.worker``) or ``hf`` (transformers' Trainer)."""
    run_dir: str | None = None
    """The run directory (plan.json, ds_config.json) the ranks are launched from."""
    hf_ds_config: str | None = None
    """For ``trainer == "hf"``: the run directory's ``ds_config.hf.json`` plus the csv monitor."""
    lora: LoraSettings | None = None
    """LoRA adapters on a frozen base (``--lora-rank``); None: every weight trains."""
    merge: bool = False
    """With ``lora``: also export the base with the adapters merged into OUTPUT/model."""
    report_to: tuple[str, ...] = ("csv",)
    """``--report-to``: the metric backends (csv, tensorboard, wandb), writing under OUTPUT/logs/;
    the native loop through DeepSpeed's monitor blocks in ``ds_config``, the Trainer through
    ``TrainingArguments.report_to`` (``dstk.train.logs``)."""
    attn_implementation: str | None = None
    """transformers' ``attn_implementation`` for every model the ranks build: the plan's
    ``training.attention`` (``dstk.plan.HF_ATTENTION``: sdpa, eager, flash_attention_2), the
    kernel its memory and step time were priced with; None (a run directory without it): transformers'
    default (sdpa where the class has it, else eager)."""

    def __post_init__(self) -> None:
        for name in ("num_steps", "world_size", "tp", "pp", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected >= 1, got {getattr(self, name)}")
        for name in ("save_every", "eval_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected >= 0, got {getattr(self, name)}")
        if self.trainer not in ("native", "hf"):
            raise ValueError(f"trainer: expected native|hf, got {self.trainer!r}")
        if self.merge and self.lora is None:
            raise ValueError("merge: only with lora (a full fine-tune's export is already merged)")
        if self.precision not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"precision: expected bf16|fp16|fp32, got {self.precision!r}")
        if self.attn_implementation not in (None, "eager", "sdpa", "flash_attention_2"):
            raise ValueError(f"attn_implementation: expected eager|sdpa|flash_attention_2 or None, "
                             f"got {self.attn_implementation!r}")

    def dump(self, path: str | os.PathLike) -> None:
        from dstk.launch.run import write_atomic

        write_atomic(path, json.dumps(dataclasses.asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TrainSpec":
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if data.get("lora") is not None:
            data["lora"] = LoraSettings.from_json(data["lora"])
        if "report_to" in data:
            data["report_to"] = tuple(data["report_to"])
        return cls(**data)
