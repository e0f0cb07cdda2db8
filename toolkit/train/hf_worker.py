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


def _reporting(spec: TrainSpec, *, tokens_per_step: int):
    """A ``TrainerCallback`` for rank 0: each of the Trainer's logs (every ``logging_steps``, and the
    first and last step) as a
    ``progress_record`` line that the parent draws (``dstk.train.logs.RunSink``), the eval loss as
    a line, and with csv in ``report_to`` the loss and lr into DeepSpeed's csv monitor (the engine
    writes only its own lr and timers there; the Trainer has no csv backend)."""
    import time

    from transformers import TrainerCallback

    from dstk.train.progress import progress_record

    class Reporting(TrainerCallback):
        def __init__(self):
            self.trainer = None
            self.t0 = time.perf_counter()
            self.start = 0

        def on_train_begin(self, args, state, control, **kwargs):
            self.t0, self.start = time.perf_counter(), state.global_step

        def on_step_end(self, args, state, control, **kwargs):
            # Also log the first and the last step, as the native loop does: the progress line then
            # starts at once and ends at steps/steps with the summary below it.
            if state.global_step in (self.start + 1, state.max_steps):
                control.should_log = True

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs, step = logs or {}, state.global_step
            engine = getattr(self.trainer, "model_wrapped", None)
            monitor = getattr(engine, "monitor", None)
            if "loss" in logs and "csv" in spec.report_to and monitor is not None:
                monitor.write_events([("Train/loss", logs["loss"], step),
                                      ("Train/lr", logs.get("learning_rate", 0.0), step)])
            if not state.is_world_process_zero:
                return
            if "loss" in logs:
                elapsed = time.perf_counter() - self.t0
                print(progress_record(step=step, num_steps=state.max_steps, loss=float(logs["loss"]),
                                      tokens_per_second=tokens_per_step * (step - self.start) / max(elapsed, 1e-9),
                                      lr=float(logs.get("learning_rate", 0.0)), elapsed_seconds=elapsed,
                                      start_step=self.start), flush=True)
            if "eval_loss" in logs:
                ev = logs["eval_loss"]
                print(f"step {step}: eval loss {ev:.4f}, perplexity {math.exp(min(ev, 50)):.2f}", flush=True)

    return Reporting()


def _stopping(stop, *, spec: TrainSpec):
    """A ``TrainerCallback`` that acts on a stop signal as the native loop does (``dstk.train.worker``): after
    every optimizer step the ranks agree on it (``agree_stop``, one all-reduce), and once any rank got one,
    the Trainer saves its checkpoint of that step (``checkpoint-N``) and stops; ``main`` then says the step
    and the save time (``stop_line``) and exits 128 + the signal. On a resume, rank 0 trims DeepSpeed's csv
    files to the checkpoint's step before the first step (``continue_csv_monitor``)."""
    import time

    from transformers import TrainerCallback

    from dstk.train.worker import agree_stop

    class Stopping(TrainerCallback):
        def __init__(self):
            self.trainer = None
            self.signum, self.step, self.began, self.save_seconds = 0, 0, 0.0, 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            engine = getattr(self.trainer, "model_wrapped", None)
            if spec.resume and state.global_step and state.is_world_process_zero and engine is not None:
                from dstk.train.logs import continue_csv_monitor

                continue_csv_monitor(getattr(engine, "monitor", None), last_step=state.global_step,
                                     last_samples=int(getattr(engine, "global_samples", 0)))

        def on_step_end(self, args, state, control, **kwargs):
            signum = agree_stop(stop.signum)
            if signum and not self.signum:
                self.signum, self.step, self.began = signum, state.global_step, time.perf_counter()
                control.should_save = True  # the Trainer saves right after this callback, then stops
                control.should_training_stop = True

        def on_save(self, args, state, control, **kwargs):
            if self.signum:
                self.save_seconds = time.perf_counter() - self.began

    return Stopping()


def main(argv: list[str]) -> int:
    import time

    from dstk.train.worker import StopRequest, stop_line

    # Before anything slow: a stop signal from here on saves at the end of a step instead of killing the rank.
    stop = StopRequest()
    stop.install()
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
    import os

    from dstk.train.logs import wandb_env

    # The Trainer's own tensorboard and wandb integrations, writing under OUTPUT/logs like the native loop's.
    report_to = [name for name in spec.report_to if name != "csv"]
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(out / "logs" / "tensorboard"))
    if "wandb" in report_to:
        os.environ.update(wandb_env(logs_dir=str(out / "logs")))
        os.environ.setdefault("WANDB_PROJECT", "dstk-finetune")
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
        save_steps=spec.save_every or spec.num_steps, save_strategy="steps", report_to=report_to,
        eval_strategy="steps" if spec.eval_every and evals is not None else "no",
        eval_steps=spec.eval_every or None, disable_tqdm=True, dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available(), ddp_backend=None if torch.cuda.is_available() else "gloo",
    )
    model = build_model(spec)
    from transformers.trainer_callback import PrinterCallback

    reporting = _reporting(spec, tokens_per_step=args.per_device_train_batch_size * args.gradient_accumulation_steps
                           * (spec.world_size // spec.tp) * train.shape[1])
    stopping = _stopping(stop, spec=spec)
    trainer = Trainer(model=model, args=args, train_dataset=_Blocks(train),
                      eval_dataset=_Blocks(evals) if evals is not None else None, callbacks=[reporting, stopping])
    reporting.trainer = stopping.trainer = trainer
    trainer.remove_callback(PrinterCallback)  # its dict per log: the progress records say the same
    from dstk.train.checkpoint import newest_hf_trainer

    # The newest checkpoint the Trainer finished writing (resume_from_checkpoint=True would take the newest
    # folder, even one a kill cut short).
    done = newest_hf_trainer(out / "checkpoints") if spec.resume else None
    trainer.train(resume_from_checkpoint=None if done is None else str(out / "checkpoints" / f"checkpoint-{done}"))
    if stopping.signum:
        if trainer.is_world_process_zero():
            since = None if stop.monotonic_seconds is None else time.monotonic() - stop.monotonic_seconds
            print(stop_line(signum=stopping.signum, step=stopping.step, num_steps=spec.num_steps,
                            checkpoint=str(out / "checkpoints" / f"checkpoint-{stopping.step}"),
                            save_seconds=stopping.save_seconds, since_signal_seconds=since), flush=True)
        return 128 + stopping.signum  # not 0: the run did not finish (dstk.train.logs.RunSink.saved_on_signal)
    metrics = trainer.evaluate() if evals is not None else {}
    trainer.save_model(str(out / "model"))
    if trainer.is_world_process_zero():
        AutoTokenizer.from_pretrained(spec.tokenizer_dir).save_pretrained(str(out / "model"))
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        ev = metrics.get("eval_loss")
        summary = {"steps": spec.num_steps, "first_loss": losses[0] if losses else None,
                   "last_loss": losses[-1] if losses else None, "eval_loss": ev,
                   "eval_perplexity": None if ev is None else math.exp(min(ev, 50)),
                   "export_dir": str(out / "model"), "trainer": "hf", "log_history": trainer.state.log_history,
                   "attn_implementation": model.config._attn_implementation}
        from dstk.launch.run import write_atomic

        write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
        print(f"trained {spec.num_steps} steps with transformers' Trainer: loss "
              f"{summary['first_loss']} -> {summary['last_loss']}; eval loss {ev}; exported HF model: {out / 'model'}",
              flush=True)
    return 0


if __name__ == "__main__":
    from dstk.launch.rank import exit_rank

    exit_rank(main([a for a in sys.argv[1:] if not a.startswith("--local_rank")]))
