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

``fill_auto`` fills ``"auto"`` for ``--hf --deepspeed`` the same way, from what is known only; what nothing
gives is reported (DS242), never made up.
"""

from __future__ import annotations

import copy
import dataclasses
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
    from dstk.intent import parse_user_text

    try:
        with open(path, "rb") as fh:
            raw = fh.read(1 << 20)
    except OSError as exc:
        raise UsageError(f"cannot read --training-args {path}: {exc.strerror or exc}",
                         hint="pass the training_args.json that dstk generate wrote, or "
                              "TrainingArguments.to_json_string() saved to a file") from None
    if not raw.lstrip().startswith((b"{", b"[")):
        raise UsageError(f"--training-args {path} is not JSON (it does not start with {{)",
                         hint="save the arguments with TrainingArguments.to_json_string()")
    # strict, as the intent: a duplicate key (json.load keeps the last silently), NaN, deep nesting: file:line
    data, _lines = parse_user_text(raw, source=str(path), what="training arguments file",
                                   example="TrainingArguments.to_json_string() saved to a file")
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


# ---------------------------------------------------------------------------------------------- "auto" for --deepspeed

_IMPLIED = {"/train_micro_batch_size_per_gpu": "per_device_train_batch_size",
            "/gradient_accumulation_steps": "gradient_accumulation_steps",
            "/gradient_clipping": "max_grad_norm", "/optimizer/params/lr": "learning_rate",
            "/scheduler/params/warmup_max_lr": "learning_rate", "/optimizer/params/eps": "adam_epsilon",
            "/optimizer/params/weight_decay": "weight_decay"}
"""An explicit DeepSpeed value that pins one training argument: the Trainer stops with a mismatch
unless the argument equals it (``fill_match``), so a run that starts has that argument."""
_HIDDEN = {"/zero_optimization/reduce_bucket_size": "hidden_size x hidden_size",
           "/zero_optimization/stage3_prefetch_bucket_size": "0.9 x hidden_size x hidden_size",
           "/zero_optimization/stage3_param_persistence_threshold": "10 x hidden_size"}


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Unfilled:
    """An ``"auto"`` the Trainer fills from something nobody gave dstk."""

    pointer: str
    needs: str
    """What the Trainer fills it from (a training argument, the world size, the model's hidden size)."""
    hint: str
    """How to give it, a sentence."""


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Filled:
    """What ``fill_auto`` made of a config."""

    config: dict
    """A copy with every fillable ``"auto"`` filled and the others taken out."""
    unfilled: tuple[Unfilled, ...]
    batch_stand_in: bool = False
    """Whether ``train_micro_batch_size_per_gpu = 1`` was put in only so that DeepSpeed reaches its other checks
    (neither batch key could be filled)."""


def _set(config: dict, pointer: str, value) -> None:
    parts = pointer.strip("/").split("/")
    node = config
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value


def _drop(config: dict, pointer: str) -> None:
    parts = pointer.strip("/").split("/")
    node = config
    for part in parts[:-1]:
        node = node[part]
    node.pop(parts[-1], None)


def _stage3(config: dict) -> bool:
    zero = config.get("zero_optimization")
    return isinstance(zero, dict) and zero.get("stage") == 3


def fill_auto(config: dict, *, training_args: dict | None, world_size: int | None) -> Filled:
    """``"auto"`` filled as transformers' Trainer fills it (``HfTrainerDeepSpeedConfig.trainer_config_process``
    and ``trainer_config_finalize``, transformers 5.24 ``integrations/deepspeed.py``), from what is known and
    nothing else: the training arguments when given (a key missing from that file takes ``TrainingArguments``'
    default, as ``TrainingArguments(**json)`` would), else only the arguments the file's explicit values pin
    (``_IMPLIED``: an explicit ``optimizer.params.lr`` is the learning rate, so an ``"auto"``
    ``warmup_max_lr`` gets it); the world size for ``train_batch_size``; ``max_steps > 0`` (or an explicit
    ``total_num_steps``) for the scheduler's step counts. The model's hidden size is never known here.

    Returns the filled copy and what could not be filled. An unfilled key is taken out of the copy, so DeepSpeed
    checks the rest with its own default there; when neither batch key is left, the copy gets
    ``train_micro_batch_size_per_gpu = 1`` only so that DeepSpeed reaches its other checks (the report says so).
    Keys the Trainer does not fill (DS108/DS109) stay ``"auto"``, as the Trainer leaves them."""
    out = copy.deepcopy(config)
    if training_args is not None:
        args = {**DEFAULTS, **training_args}
    else:
        args = {}
        for pointer, name in _IMPLIED.items():
            value = _node(config, pointer)
            if value is not None and value != "auto" and name not in args:
                args[name] = value
        betas = _node(config, "/optimizer/params/betas")
        if isinstance(betas, list) and len(betas) == 2:
            args["adam_beta1"], args["adam_beta2"] = betas
    steps = args.get("max_steps")
    num_steps = steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else None
    explicit_total = _node(config, "/scheduler/params/total_num_steps")
    if num_steps is None and isinstance(explicit_total, int) and explicit_total > 0:
        num_steps = explicit_total
    args_file = "--training-args FILE (TrainingArguments.to_json_string() saved to a file)"
    given = f"pass {args_file}"
    steps_hint = "pass --training-args FILE with max_steps > 0, or write the number"

    def arg(name: str):
        return args.get(name)

    micro, accum = arg("per_device_train_batch_size"), arg("gradient_accumulation_steps")
    warmup = None
    if num_steps is not None and training_args is not None:
        warmup = _warmup(args, num_steps)
    fills: list[tuple[str, object, str, str]] = [  # pointer, value (None: unknown), what it needs, how to give it
        ("/train_micro_batch_size_per_gpu", micro, "TrainingArguments.per_device_train_batch_size", given),
        ("/gradient_accumulation_steps", accum, "TrainingArguments.gradient_accumulation_steps", given),
        ("/train_batch_size", None if None in (world_size, micro, accum) else world_size * micro * accum,
         "the world size x per_device_train_batch_size x gradient_accumulation_steps",
         "pass " + " and ".join(([] if world_size is not None else ["--world-size N"])
                                + ([args_file] if None in (micro, accum) else []))),
        ("/gradient_clipping", arg("max_grad_norm"), "TrainingArguments.max_grad_norm", given),
        ("/optimizer/params/lr", arg("learning_rate"), "TrainingArguments.learning_rate", given),
        ("/optimizer/params/betas", None if None in (arg("adam_beta1"), arg("adam_beta2"))
         else [arg("adam_beta1"), arg("adam_beta2")], "TrainingArguments.adam_beta1, adam_beta2", given),
        ("/optimizer/params/eps", arg("adam_epsilon"), "TrainingArguments.adam_epsilon", given),
        ("/optimizer/params/weight_decay", arg("weight_decay"), "TrainingArguments.weight_decay", given),
        ("/scheduler/params/warmup_min_lr", 0, "", ""),
        ("/scheduler/params/warmup_max_lr", arg("learning_rate"), "TrainingArguments.learning_rate", given),
        ("/fp16/enabled", None if training_args is None else bool(args["fp16"] or args["fp16_full_eval"]),
         "TrainingArguments.fp16 or fp16_full_eval", given),
        ("/bf16/enabled", None if training_args is None else bool(args["bf16"] or args["bf16_full_eval"]),
         "TrainingArguments.bf16 or bf16_full_eval", given),
        ("/scheduler/params/total_num_steps", num_steps,
         "the number of training steps (max_steps, or the data set's length x epochs / the global batch, which "
         "the Trainer computes at train())", steps_hint),
        ("/scheduler/params/warmup_num_steps", warmup,
         "max(1, TrainingArguments.get_warmup_steps(number of training steps))",
         steps_hint),
    ]
    unfilled: list[Unfilled] = []
    for pointer, value, needs, hint in fills:
        if _node(config, pointer) != "auto":
            continue
        if value is None:
            _drop(out, pointer)
            unfilled.append(Unfilled(pointer=pointer, needs=needs, hint=hint))
        else:
            _set(out, pointer, value)
    for pointer, formula in _HIDDEN.items():
        if _node(config, pointer) == "auto" and (pointer.endswith("reduce_bucket_size") or _stage3(config)):
            _drop(out, pointer)
            unfilled.append(Unfilled(pointer=pointer, needs=f"the model's hidden size ({formula})",
                                     hint="write the number (the Trainer takes it from the model's config)"))
    if training_args is not None and training_args.get("save_on_each_node"):
        out.setdefault("checkpoint", {})["use_node_local_storage"] = True
    dropped = {u.pointer for u in unfilled}
    stand_in = bool(dropped & {"/train_batch_size", "/train_micro_batch_size_per_gpu"}) and \
        "train_batch_size" not in out and "train_micro_batch_size_per_gpu" not in out
    if stand_in:
        out["train_micro_batch_size_per_gpu"] = 1
    return Filled(config=out, unfilled=tuple(unfilled), batch_stand_in=stand_in)


def unfilled_findings(filled: Filled) -> list[Finding]:
    """DS242 for each ``"auto"`` the ``--deepspeed`` check could not fill (``fill_auto``)."""
    out = []
    for u in filled.unfilled:
        batch = filled.batch_stand_in and u.pointer == "/train_micro_batch_size_per_gpu"
        what = ("DeepSpeed was given 1 there, only to reach its other checks" if batch else
                "DeepSpeed checked the file without it")
        out.append(Finding(
            severity="warning", code="DS242", pointer=u.pointer,
            message=f'{u.pointer} is "auto": the Trainer fills it from {u.needs}, which nothing here gives, so '
                    f"{what}", hint=u.hint))
    return out
