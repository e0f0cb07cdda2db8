"""``dstk validate --hf --training-args training_args.json``: the explicit DeepSpeed values that
disagree with transformers' ``TrainingArguments``.

transformers compares them only inside ``Trainer`` (``HfTrainerDeepSpeedConfig.fill_match``, called by
``trainer_config_process`` when the ``TrainingArguments`` are built and by ``trainer_config_finalize``
in ``deepspeed.initialize``'s preparation; transformers 5.24 ``integrations/deepspeed.py``), so a
mismatch surfaces after the job has queued and loaded the model. This module repeats the same pairs
without importing transformers: a value is compared only when the DeepSpeed key is present and not
"auto" (``fill_match`` skips absent keys and fills "auto"), with the same exact equality.

Training arguments missing from the JSON take ``TrainingArguments``' defaults (transformers 5.24
``training_args.py``): per-device batch 8, accumulation 1, lr 5e-5, weight decay 0, betas 0.9/0.999,
eps 1e-8, max_grad_norm 1.0, fp16/bf16 off, max_steps -1, warmup_steps 0.
"""

from __future__ import annotations

import json
import math
import os

from dstk.findings import Finding

DEFAULTS: dict = {
    "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "learning_rate": 5e-5,
    "weight_decay": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "max_grad_norm": 1.0,
    "fp16": False, "fp16_full_eval": False, "bf16": False, "bf16_full_eval": False, "max_steps": -1,
    "warmup_steps": 0, "warmup_ratio": 0.0,
}


def read_training_args(path: str | os.PathLike) -> dict:
    """A ``training_args.json`` (``TrainingArguments.to_json_string()`` or dstk's export) as a dict."""
    from dstk.errors import UsageError

    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise UsageError(f"cannot read --training-args {path}: {exc.strerror or exc}",
                         hint="pass the training_args.json that dstk generate wrote, or "
                              "TrainingArguments.to_json_string() saved to a file") from None
    except ValueError as exc:
        raise UsageError(f"--training-args {path} is not JSON: {exc}",
                         hint="save the arguments with TrainingArguments.to_json_string()") from None
    if not isinstance(data, dict):
        raise UsageError(f"--training-args {path} holds a {type(data).__name__}, not a JSON object",
                         hint="save the arguments with TrainingArguments.to_json_string()")
    return data


def _node(config: dict, pointer: str):
    node = config
    for part in pointer.strip("/").split("/"):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _warmup(args: dict, num_steps: int) -> int:
    """``TrainingArguments.get_warmup_steps``: an integer count, or a fraction (< 1) of the run;
    the legacy ``warmup_ratio`` when warmup_steps is 0. Then ``max(1, ...)`` as trainer_config_finalize."""
    steps = args["warmup_steps"]
    if steps == 0 and args.get("warmup_ratio"):
        steps = args["warmup_ratio"]
    count = int(steps) if steps >= 1 else math.ceil(num_steps * steps)
    return max(1, count)


def pairs(training_args: dict, *, world_size: int | None) -> list[tuple[str, object, str]]:
    """(DeepSpeed pointer, the value the Trainer would put there, the TrainingArguments name), in
    ``trainer_config_process`` / ``trainer_config_finalize`` order."""
    a = {**DEFAULTS, **training_args}
    out: list[tuple[str, object, str]] = [
        ("/train_micro_batch_size_per_gpu", a["per_device_train_batch_size"], "per_device_train_batch_size"),
        ("/gradient_accumulation_steps", a["gradient_accumulation_steps"], "gradient_accumulation_steps"),
    ]
    if world_size is not None:
        out.append(("/train_batch_size",
                    world_size * a["per_device_train_batch_size"] * a["gradient_accumulation_steps"],
                    f"world size {world_size} x per_device_train_batch_size x gradient_accumulation_steps"))
    out += [
        ("/gradient_clipping", a["max_grad_norm"], "max_grad_norm"),
        ("/optimizer/params/lr", a["learning_rate"], "learning_rate"),
        ("/optimizer/params/betas", [a["adam_beta1"], a["adam_beta2"]], "adam_beta1, adam_beta2"),
        ("/optimizer/params/eps", a["adam_epsilon"], "adam_epsilon"),
        ("/optimizer/params/weight_decay", a["weight_decay"], "weight_decay"),
        ("/scheduler/params/warmup_max_lr", a["learning_rate"], "learning_rate"),
        ("/fp16/enabled", bool(a["fp16"] or a["fp16_full_eval"]), "fp16 or fp16_full_eval"),
        ("/bf16/enabled", bool(a["bf16"] or a["bf16_full_eval"]), "bf16 or bf16_full_eval"),
    ]
    steps = a["max_steps"]
    if isinstance(steps, int) and steps > 0:  # else the Trainer derives it from the data set's length
        out += [("/scheduler/params/total_num_steps", steps, "max_steps"),
                ("/scheduler/params/warmup_num_steps", _warmup(a, steps), "warmup_steps")]
    return out


def training_args_findings(config: dict, training_args: dict, *, world_size: int | None = None) -> list[Finding]:
    """DS240 for every explicit value the Trainer would reject as a mismatch; DS241 for an
    ``optimizer`` / ``scheduler`` block that silently replaces the Trainer's ``optim`` /
    ``lr_scheduler_type`` (transformers ``deepspeed_optim_sched`` uses the DeepSpeed block when present)."""
    if not isinstance(config, dict):
        return []
    findings = []
    for pointer, hf_value, hf_name in pairs(training_args, world_size=world_size):
        ds_value = _node(config, pointer)
        if ds_value is None or ds_value == "auto" or ds_value == hf_value:
            continue
        findings.append(Finding(
            severity="error", code="DS240", pointer=pointer,
            message=f"{pointer} is {json.dumps(ds_value)} but the training arguments give {hf_name} = "
                    f"{json.dumps(hf_value)}: the Trainer stops with a mismatch error",
            hint=f'write "auto" at {pointer} (the Trainer fills it) or make the two agree'))
    zero = config.get("zero_optimization")
    offload = isinstance(zero, dict) and isinstance(zero.get("offload_optimizer"), dict) and \
        zero["offload_optimizer"].get("device") in ("cpu", "nvme")
    for block, arg in (("optimizer", "optim"), ("scheduler", "lr_scheduler_type")):
        if block == "optimizer" and offload:
            continue  # wanted there: see dstk.render.ds_config (accelerate swaps the Trainer's for CPU Adam)
        if isinstance(config.get(block), dict) and arg in training_args:
            findings.append(Finding(
                severity="warning", code="DS241", pointer=f"/{block}",
                message=f"the DeepSpeed {block} block replaces the training arguments' {arg} = "
                        f"{json.dumps(training_args[arg])}, silently",
                hint=f"remove /{block} to train with {arg}, or drop {arg} from the training arguments"))
    return findings
