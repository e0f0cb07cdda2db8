"""One rank of ``dstk finetune --trainer hf``: the same prepared data and plan through transformers'
Trainer with the run directory's ``ds_config.hf.json`` (HF fills its ``"auto"`` values from
``TrainingArguments``, which take the plan's figures). ``python -m dstk.train.hf_worker SPEC_JSON``."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from dstk.train.spec import TrainSpec


class _Blocks:
    """Packed blocks as a map-style dataset of {input_ids, labels}."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __len__(self) -> int:
        return len(self.tensor)

    def __getitem__(self, i):
        return {"input_ids": self.tensor[i], "labels": self.tensor[i]}


def main(argv: list[str]) -> int:
    import torch
    from transformers import AutoTokenizer, Trainer, TrainingArguments

    from dstk.train.worker import build_model

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    spec = TrainSpec.load(argv[0])
    ds_plain = json.loads(Path(spec.ds_config).read_text(encoding="utf-8"))
    opt = ds_plain.get("optimizer", {}).get("params", {})
    sched = ds_plain.get("scheduler", {}).get("params", {})
    # ds_config.hf.json has no optimizer/scheduler block (dstk.render.ds_config): the Trainer builds
    # the plan's from these arguments, as in dstk.render.training_arguments.
    optim = {"SGD": "sgd", "Adafactor": "adafactor", "Lion": "lion_32bit"}.get(
        ds_plain.get("optimizer", {}).get("type"), "adamw_torch")
    schedule = {"WarmupCosineLR": {"lr_scheduler_type": "cosine_with_min_lr",
                                   "lr_scheduler_kwargs": {"min_lr_rate": float(sched.get("cos_min_ratio", 0.0))}},
                "WarmupDecayLR": {"lr_scheduler_type": "linear"}}.get(
        ds_plain.get("scheduler", {}).get("type"), {"lr_scheduler_type": "constant_with_warmup"})
    train = torch.load(spec.train_blocks)
    evals = torch.load(spec.eval_blocks) if spec.eval_blocks else None
    out = Path(spec.output_dir)
    args = TrainingArguments(
        output_dir=str(out / "checkpoints"), max_steps=spec.num_steps, seed=spec.seed, data_seed=spec.seed,
        per_device_train_batch_size=int(ds_plain["train_micro_batch_size_per_gpu"]),
        per_device_eval_batch_size=int(ds_plain["train_micro_batch_size_per_gpu"]),
        gradient_accumulation_steps=int(ds_plain.get("gradient_accumulation_steps", 1)),
        learning_rate=float(opt.get("lr", 1e-3)), weight_decay=float(opt.get("weight_decay", 0.0)),
        adam_beta1=float(opt.get("betas", [0.9, 0.999])[0]), adam_beta2=float(opt.get("betas", [0.9, 0.999])[1]),
        adam_epsilon=float(opt.get("eps", 1e-8)), max_grad_norm=float(ds_plain.get("gradient_clipping", 1.0)),
        warmup_steps=int(sched.get("warmup_num_steps", 0)), bf16=spec.precision == "bf16", optim=optim, **schedule,
        fp16=spec.precision == "fp16", deepspeed=spec.hf_ds_config, logging_steps=spec.log_every,
        save_steps=spec.save_every or spec.num_steps, save_strategy="steps", report_to=[],
        eval_strategy="steps" if spec.eval_every and evals is not None else "no",
        eval_steps=spec.eval_every or None, disable_tqdm=True, dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available(), ddp_backend=None if torch.cuda.is_available() else "gloo",
    )
    model = build_model(spec)
    trainer = Trainer(model=model, args=args, train_dataset=_Blocks(train),
                      eval_dataset=_Blocks(evals) if evals is not None else None)
    has_ckpt = any((out / "checkpoints").glob("checkpoint-*"))
    trainer.train(resume_from_checkpoint=bool(spec.resume and has_ckpt))
    metrics = trainer.evaluate() if evals is not None else {}
    trainer.save_model(str(out / "model"))
    if trainer.is_world_process_zero():
        AutoTokenizer.from_pretrained(spec.tokenizer_dir).save_pretrained(str(out / "model"))
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        ev = metrics.get("eval_loss")
        summary = {"steps": spec.num_steps, "first_loss": losses[0] if losses else None,
                   "last_loss": losses[-1] if losses else None, "eval_loss": ev,
                   "eval_perplexity": None if ev is None else math.exp(min(ev, 50)),
                   "export_dir": str(out / "model"), "trainer": "hf", "log_history": trainer.state.log_history}
        from dstk.launch.run import write_atomic

        write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
        print(f"trained {spec.num_steps} steps with transformers' Trainer: loss "
              f"{summary['first_loss']} -> {summary['last_loss']}; eval loss {ev}; exported HF model: {out / 'model'}",
              flush=True)
    return 0


if __name__ == "__main__":
    from dstk.launch.rank import exit_rank

    exit_rank(main([a for a in sys.argv[1:] if not a.startswith("--local_rank")]))
