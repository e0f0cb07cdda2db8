"""Cross-field rules: what DeepSpeed 0.19.8 checks late (at initialize or the first step), checks
against the wrong world size, or never checks at all. Facts and line numbers are in
/work/shared/research/deepspeed-config-surface.md (sections 3 and 4).

Every rule is a pure function ``rule(config, ctx) -> Iterable[Finding]`` over a config whose
``"auto"`` values were already taken out; rules read values through :func:`_get`, which returns
``None`` for absent or mistyped values (the schema reports those), so a rule never crashes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from dstk.findings import Finding
from dstk.validate.schema import did_you_mean, findings_for, load_schema

REMOVED_TOP_LEVEL = {
    "nebula": "Nebula checkpointing was removed",
    "compression_training": "the compression library was removed",
    "amp": "NVIDIA Apex AMP was removed; use fp16, bf16 or torch_autocast",
    "quantize_training": "MoQ / quantize_training was removed",
    "sparse_gradients": "sparse embedding-gradient compression was removed",
    "eigenvalue": "eigenvalue MoQ was removed",
    "sparse_attention": "Sparse Attention was removed",
    "elasticity": "elastic training was removed; set the batch triad directly",
    "graph_harvesting": "graph harvesting was removed",
    "curriculum_learning": "top-level curriculum_learning was removed; use "
                           "data_efficiency.data_sampling.curriculum_learning",
    "progressive_layer_drop": "Progressive Layer Dropping was removed",
}
"""``deepspeed/runtime/config.py`` ``_REMOVED_TOP_LEVEL_CONFIG_KEYS``: DeepSpeedConfig raises on them."""
REMOVED_ZERO = {
    "mics_shard_size": "MiCS sharding was removed",
    "mics_hierarchical_params_gather": "MiCS sharding was removed",
    "zeropp_loco_param": "LoCo-ZeRO++ was removed",
}

# Pydantic sections: DeepSpeed drops "auto" there and uses the default (config_utils.py:54-57).
PYDANTIC_SECTIONS = {"zero_optimization", "fp16", "bf16", "bfloat16", "tensorboard", "wandb", "csv_monitor",
                     "comet", "comms_logger", "hybrid_engine", "compile", "weight_quantization"}

HF_FILLS = {
    "/train_micro_batch_size_per_gpu": "TrainingArguments.per_device_train_batch_size",
    "/gradient_accumulation_steps": "TrainingArguments.gradient_accumulation_steps",
    "/train_batch_size": "world_size x per_device_train_batch_size x gradient_accumulation_steps",
    "/gradient_clipping": "TrainingArguments.max_grad_norm",
    "/optimizer/params/lr": "TrainingArguments.learning_rate",
    "/optimizer/params/betas": "[adam_beta1, adam_beta2]",
    "/optimizer/params/eps": "TrainingArguments.adam_epsilon",
    "/optimizer/params/weight_decay": "TrainingArguments.weight_decay",
    "/scheduler/params/warmup_min_lr": "0",
    "/scheduler/params/warmup_max_lr": "TrainingArguments.learning_rate",
    "/scheduler/params/total_num_steps": "the number of training steps",
    "/scheduler/params/warmup_num_steps": "max(1, TrainingArguments.get_warmup_steps(num_training_steps))",
    "/fp16/enabled": "TrainingArguments.fp16 or fp16_full_eval",
    "/bf16/enabled": "TrainingArguments.bf16 or bf16_full_eval",
    "/zero_optimization/reduce_bucket_size": "hidden_size x hidden_size of the model",
    "/zero_optimization/stage3_prefetch_bucket_size": "0.9 x hidden_size^2 (ZeRO-3 only)",
    "/zero_optimization/stage3_param_persistence_threshold": "10 x hidden_size (ZeRO-3 only)",
}
"""Where transformers' Trainer fills ``"auto"`` (``transformers/integrations/deepspeed.py``
``trainer_config_process`` / ``trainer_config_finalize``) and what from."""
HF_UNDER_OTHER_NAME = {"/zero_optimization/prefetch_bucket_size": "stage3_prefetch_bucket_size",
                       "/zero_optimization/param_persistence_threshold": "stage3_param_persistence_threshold"}
"""DeepSpeed's field names whose ``stage3_`` alias is the one HF fills (``DeepSpeedZeroConfig`` reads both;
``HfTrainerDeepSpeedConfig.trainer_config_finalize`` fills ``"auto"`` only under the alias). axolotl's
``deepspeed_configs/zero3_bf16.json`` writes them unprefixed, so its "auto" is never filled."""
HF_STAGE3_ONLY = {"/zero_optimization/stage3_prefetch_bucket_size",
                  "/zero_optimization/stage3_param_persistence_threshold"}
ACCELERATE_FILLS = {
    "/zero_optimization/stage": "accelerate's zero_stage",
    "/zero_optimization/offload_optimizer/device": "accelerate's offload_optimizer_device",
    "/zero_optimization/offload_param/device": "accelerate's offload_param_device",
    "/zero_optimization/offload_optimizer/nvme_path": "accelerate's offload_optimizer_nvme_path",
    "/zero_optimization/offload_param/nvme_path": "accelerate's offload_param_nvme_path",
    "/zero_optimization/stage3_gather_16bit_weights_on_model_save": "accelerate's zero3_save_16bit_model",
}
"""Filled by accelerate's DeepSpeedPlugin from its own config (``accelerate/utils/dataclasses.py``),
not by the Trainer."""
NATIVE_AUTO = {
    "/pipeline/stages", "/data_types/keep_in_fp32_modules", "/zero_optimization/zenflow/select_strategy",
    "/zero_optimization/zenflow/select_interval", "/zero_optimization/zenflow/update_interval",
    "/expert_parallel/score_apply", "/expert_parallel/combine_impl", "/expert_parallel/row_weighting_impl",
    "/expert_parallel/score_func", "/expert_parallel/top_k", "/expert_parallel/routed_scaling_factor",
}
"""Keys where ``"auto"`` is a real DeepSpeed value, not a placeholder."""


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Context:
    world_size: int | None
    tensor_parallel: int
    pipeline_stages: int
    hf: bool
    auto_pointers: frozenset[str] = frozenset()
    """Pointers whose "auto" placeholder was taken out before the rules ran."""


def _get(config, *path, kind=None):
    node = config
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    if kind is not None:
        if kind is int and (isinstance(node, bool) or not isinstance(node, (int, float))
                            or (isinstance(node, float) and not node.is_integer())):
            return None
        if kind is float and (isinstance(node, bool) or not isinstance(node, (int, float))):
            return None
        if kind is bool and not isinstance(node, bool):
            return None
        if kind in (str, dict, list) and not isinstance(node, kind):
            return None
        if kind is int:
            node = int(node)
    return node


def _err(code, pointer, message, hint=None, severity="error") -> Finding:
    return Finding(severity=severity, code=code, pointer=pointer, message=message, hint=hint)


def _stage(config) -> int:
    zero = config.get("zero_optimization")
    if isinstance(zero, bool):
        return int(zero)
    stage = _get(config, "zero_optimization", "stage", kind=int)
    return stage if stage in (0, 1, 2, 3) else 0


def _enabled(config, section) -> bool:
    return _get(config, section, "enabled", kind=bool) is True


DTYPE_NAMES = {name: short for short, names in (
    ("fp16", ("fp16", "float16", "half", "torch.float16")), ("fp32", ("fp32", "float32", "float", "torch.float32")),
    ("bf16", ("bf16", "bfloat16", "torch.bfloat16")), ("int8", ("int8", "torch.int8"))) for name in names}
"""DeepSpeed's ``DtypeEnum`` spellings (``runtime/config.py``) of each dtype, read by ``data_types``."""


def _bf16_section(config) -> str:
    return "bf16" if "bf16" in config else "bfloat16"


# ---------------------------------------------------------------------------- "auto" and removed keys


def split_auto(config: dict, ctx: Context) -> tuple[dict, list[Finding]]:
    """Take ``"auto"`` values out of (a copy of) the config and report them.

    Plain mode: every placeholder ``"auto"`` is an error (DeepSpeed's own parse fails with a TypeError on
    the batch keys, drops it silently in pydantic sections, or fails at the first step). ``--hf``: fine
    where the Trainer fills it, a finding elsewhere.
    """
    findings: list[Finding] = []

    def walk(node, pointer: str):
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                child = f"{pointer}/{key.replace('~', '~0').replace('/', '~1')}"
                if value == "auto" and child not in NATIVE_AUTO:
                    findings.extend(_auto_finding(child, config, ctx))
                    continue
                out[key] = walk(value, child)
            return out
        if isinstance(node, list):
            return [walk(v, f"{pointer}/{i}") for i, v in enumerate(node)]
        return node

    return walk(config, ""), findings


def _auto_finding(pointer: str, config: dict, ctx: Context) -> list[Finding]:
    section = pointer.split("/")[1]
    alias = HF_UNDER_OTHER_NAME.get(pointer)
    if alias:
        return [_err("DS108" if ctx.hf else "DS107", pointer,
                     f'{pointer} is "auto", which HF fills only under its other name {alias}: DeepSpeed drops it and '
                     "silently uses its default", f'rename the key to {alias} (keep "auto") for the Trainer to fill '
                     "it, or write the value", severity="warning" if ctx.hf else "error")]
    if not ctx.hf:
        source = HF_FILLS.get(pointer)
        hint = (f"HF transformers' Trainer fills it from {source}: validate with --hf if the Trainer reads this "
                "file, otherwise write the value") if source else "write the value"
        if section in PYDANTIC_SECTIONS:
            what = "DeepSpeed drops it and silently uses its default"
        else:
            what = "DeepSpeed keeps the string and fails on it (a TypeError at parse, initialize or the first step)"
        return [_err("DS107", pointer, f'{pointer} is "auto": {what}', hint)]
    if pointer in HF_FILLS:
        if pointer in HF_STAGE3_ONLY and _stage(config) != 3:
            return [_err("DS108", pointer, f'{pointer} is "auto", but HF fills it only with ZeRO stage 3; '
                         "DeepSpeed drops it and uses its default", "remove it or write the value",
                         severity="warning")]
        return []
    if pointer in ACCELERATE_FILLS:
        return [_err("DS109", pointer, f'{pointer} is "auto": only accelerate fills it (from '
                     f"{ACCELERATE_FILLS[pointer]}), HF's Trainer alone does not", "write the value unless you launch "
                     "with `accelerate launch` and a DeepSpeed plugin config", severity="warning")]
    if section in PYDANTIC_SECTIONS:
        return [_err("DS108", pointer, f'{pointer} is "auto", which HF does not fill: DeepSpeed drops it and '
                     "silently uses its default", "write the value (`dstk schema --hf-auto` lists what HF fills)",
                     severity="warning")]
    return [_err("DS108", pointer, f'{pointer} is "auto", which HF does not fill: DeepSpeed keeps the string and '
                 "fails on it", "write the value (`dstk schema --hf-auto` lists what HF fills)")]


def removed_tables() -> tuple[dict, dict, str]:
    """The checked release's removed keys (its schema's ``x-dstk-removed``, from its own ``runtime/config.py``;
    empty before 0.19) with dstk's short reasons, and the release."""
    schema = load_schema()
    table = schema.get("x-dstk-removed", {})
    top = {k: REMOVED_TOP_LEVEL.get(k, "removed") for k in table.get("top_level", ())}
    zero = {k: REMOVED_ZERO.get(k, "removed") for k in table.get("zero_optimization", ())}
    return top, zero, schema["x-dstk-deepspeed-version"]


def split_removed(config: dict) -> tuple[dict, list[Finding]]:
    findings = []
    config = dict(config)
    removed_top, removed_zero, release = removed_tables()
    for key, why in removed_top.items():
        if key in config:
            config.pop(key)
            findings.append(_err("DS105", f"/{key}", f"'{key}' was removed in DeepSpeed {release} ({why}); "
                                 "DeepSpeedConfig raises DeepSpeedConfigError on it", f"remove '{key}'"))
    zero = config.get("zero_optimization")
    if isinstance(zero, dict):
        zero = dict(zero)
        for key, why in removed_zero.items():
            if key in zero:
                zero.pop(key)
                findings.append(_err("DS105", f"/zero_optimization/{key}", f"'{key}' was removed in DeepSpeed "
                                     f"{release} ({why}); DeepSpeedConfig raises on it", f"remove '{key}'"))
        config["zero_optimization"] = zero
    return config, findings


def deprecated(config: dict, ctx: Context) -> Iterable[Finding]:
    if isinstance(config.get("zero_optimization"), bool):
        v = config["zero_optimization"]
        yield _err("DS106", "/zero_optimization", f"zero_optimization: {str(v).lower()} is the legacy form "
                   f"(stage {int(v)})", f'write {{"stage": {int(v)}}}', severity="warning")
    if "bfloat16" in config:
        if "bf16" in config:
            yield _err("DS226", "/bfloat16", "both 'bf16' and its legacy name 'bfloat16' are set: DeepSpeed reads "
                       "'bf16' and silently ignores 'bfloat16'", "keep only 'bf16'")
        else:
            yield _err("DS106", "/bfloat16", "'bfloat16' is the legacy name of 'bf16'", "rename it to 'bf16'",
                       severity="warning")

    def walk(node, schema, pointer):
        if not isinstance(node, dict) or not isinstance(schema, dict):
            return
        props = schema.get("properties", {})
        for key, value in node.items():
            sub = props.get(key)
            if not isinstance(sub, dict):
                continue
            child = f"{pointer}/{key}"
            if sub.get("deprecated") and child != "/bfloat16":
                new = sub.get("x-dstk-replaced-by")
                yield _err("DS106", child, f"'{key}' is deprecated in DeepSpeed {load_schema()['x-dstk-deepspeed-version']}",
                           f"use '{new}'" if new else "remove it", severity="warning")
            yield from walk(value, sub, child)

    yield from walk(config, load_schema(), "")


# ---------------------------------------------------------------------------- batch triad


def _dp_size(config: dict, ctx: Context) -> tuple[int | None, list[Finding], int]:
    """Data-parallel size = world size / (TP x PP), and the TP degree used."""
    autotp = _get(config, "tensor_parallel", "autotp_size", kind=int) or 0
    tp = ctx.tensor_parallel if ctx.tensor_parallel > 1 else max(autotp, 1)
    if ctx.world_size is None:
        return None, [], tp
    model = tp * ctx.pipeline_stages
    if ctx.world_size % model:
        return None, [_err("DS203", "", f"world size {ctx.world_size} is not divisible by tensor parallel {tp} x "
                           f"pipeline stages {ctx.pipeline_stages} = {model}",
                           "choose a world size that is a multiple of " + str(model) + " or change TP/PP")], tp
    return ctx.world_size // model, [], tp


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def batch_triad(config: dict, ctx: Context) -> Iterable[Finding]:
    """DeepSpeed derives the missing member with floor division and then asserts
    ``train_batch_size == micro x grad_accum x dp`` (``runtime/config.py:590-656``)."""
    keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    if any(f"/{k}" in ctx.auto_pointers for k in keys):
        return  # "auto" is reported already; under --hf the Trainer fills the triad consistently
    present = {k: config[k] for k in keys if k in config}
    tbs = _get(config, keys[0], kind=int)
    micro = _get(config, keys[1], kind=int)
    gas = _get(config, keys[2], kind=int)
    if any(k in present and v is None for k, v in zip(keys, (tbs, micro, gas))) or any(
            v is not None and v <= 0 for v in (tbs, micro, gas)):
        return  # mistyped or out of range: the schema reports it
    if tbs is None and micro is None:
        if not ctx.hf:
            yield _err("DS202", "", "neither train_batch_size nor train_micro_batch_size_per_gpu is set: "
                       "DeepSpeedConfig asserts one of them", "set train_micro_batch_size_per_gpu (and "
                       "gradient_accumulation_steps)")
        return
    dp, found, tp = _dp_size(config, ctx)
    yield from found
    autotp = _get(config, "tensor_parallel", "autotp_size", kind=int) or 0
    if autotp > 1 and tbs is not None and ctx.world_size is not None:
        # deepspeed.initialize parses the config with the *total* rank count under AutoTP (no mpu)
        m, g = micro or tbs // ctx.world_size // (gas or 1), gas or 1
        if tbs != m * g * ctx.world_size or (dp is not None and dp != ctx.world_size):
            yield _err("DS233", "/train_batch_size", f"under AutoTP (autotp_size {autotp}) deepspeed.initialize "
                       f"checks train_batch_size against all {ctx.world_size} ranks, not the {dp} data-parallel "
                       "ranks", "leave train_batch_size out and set train_micro_batch_size_per_gpu and "
                       "gradient_accumulation_steps")
        return
    if dp is None:
        if tbs is not None and micro is not None and gas is not None and tbs % (micro * gas):
            yield _err("DS201", "/train_batch_size", f"train_batch_size {tbs} is not a multiple of "
                       f"micro {micro} x grad_accum {gas} = {micro * gas}, so no data-parallel size satisfies it",
                       f"nearest valid: {_near(tbs, micro * gas)}")
        return
    if tbs is not None and micro is not None and gas is not None:
        if tbs != micro * gas * dp:
            yield _err("DS201", "/train_batch_size", f"train_batch_size {tbs} != micro {micro} x grad_accum {gas} "
                       f"x data-parallel {dp} = {micro * gas * dp}" + _dp_note(ctx, tp),
                       _triad_fix(tbs, micro, gas, dp))
    elif tbs is not None and micro is not None:
        if tbs % (micro * dp):
            yield _err("DS201", "/train_batch_size", f"train_batch_size {tbs} is not divisible by micro {micro} x "
                       f"data-parallel {dp} = {micro * dp}: DeepSpeed derives grad_accum {tbs // (micro * dp)} "
                       f"and fails ({micro * (tbs // (micro * dp)) * dp} != {tbs})" + _dp_note(ctx, tp),
                       f"use train_batch_size {_near(tbs, micro * dp)}")
    elif tbs is not None and gas is not None:
        if tbs % (gas * dp):
            yield _err("DS201", "/train_batch_size", f"train_batch_size {tbs} is not divisible by grad_accum {gas}"
                       f" x data-parallel {dp} = {gas * dp}" + _dp_note(ctx, tp),
                       f"use train_batch_size {_near(tbs, gas * dp)}")
    elif tbs is not None:
        if tbs % dp:
            yield _err("DS201", "/train_batch_size", f"train_batch_size {tbs} is not divisible by data-parallel "
                       f"{dp}" + _dp_note(ctx, tp), f"use train_batch_size {_near(tbs, dp)}")


def _dp_note(ctx: Context, tp: int) -> str:
    return f" (data-parallel = world {ctx.world_size} / (TP {tp} x PP {ctx.pipeline_stages}))"


def _near(value: int, step: int) -> str:
    low, high = (value // step) * step, (value // step + 1) * step
    return f"{low} or {high}" if low > 0 else f"{high}"


def _triad_fix(tbs: int, micro: int, gas: int, dp: int) -> str:
    options = [f"train_batch_size {micro * gas * dp}"]
    if tbs % (micro * dp) == 0:
        options.append(f"gradient_accumulation_steps {tbs // (micro * dp)}")
    if tbs % (gas * dp) == 0:
        options.append(f"train_micro_batch_size_per_gpu {tbs // (gas * dp)}")
    if len(options) == 1:
        pairs = [(m, tbs // (m * dp)) for m in _divisors(max(tbs // dp, 1)) if tbs % (m * dp) == 0][:4]
        if pairs:
            options.append("micro/grad_accum " + ", ".join(f"{m}/{g}" for m, g in pairs))
    return "set " + ", or ".join(options)


# ---------------------------------------------------------------------------- precision and ZeRO


def precision(config: dict, ctx: Context) -> Iterable[Finding]:
    bf = _bf16_section(config)
    if _enabled(config, "fp16") and _enabled(config, bf):
        yield _err("DS204", f"/{bf}/enabled", "fp16 and bf16 are both enabled: DeepSpeed asserts "
                   "'bfloat16 and fp16 modes cannot be simultaneously enabled'", "enable only one of them")
    stage = _stage(config)
    for section, key in (("fp16", "fp16_master_weights_and_grads"), (bf, "bf16_master_weights_and_grads"),
                         (bf, "bf16_optimizer_states")):
        if _get(config, section, key, kind=bool) and stage == 0:
            yield _err("DS215", f"/{section}/{key}", f"{key} needs ZeRO stage 1, 2 or 3 (stage is 0)",
                       "set zero_optimization.stage to 1-3 or remove it")
    if _get(config, bf, "bf16_optimizer_states", kind=bool) and not _get(config, bf, "bf16_master_weights_and_grads",
                                                                          kind=bool):
        yield _err("DS215", f"/{bf}/bf16_optimizer_states", "bf16_optimizer_states needs "
                   "bf16_master_weights_and_grads: true", "set bf16_master_weights_and_grads to true")
    param = _get(config, "data_types", "param_dtype", kind=str)
    if param:
        want = {"fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16", "bf16": "bf16",
                "bfloat16": "bf16", "bfloat": "bf16", "torch.bfloat16": "bf16"}.get(param, "fp32")
        have = "fp16" if _enabled(config, "fp16") else "bf16" if _enabled(config, bf) else "fp32"
        if want != have:
            yield _err("DS220", "/data_types/param_dtype", f"data_types.param_dtype is {param!r} but the precision "
                       f"flags say {have}: deepspeed.initialize rejects the mismatch",
                       f"set param_dtype to {have!r} or enable {want}")
    accum = _get(config, "data_types", "grad_accum_dtype", kind=str)
    if accum and stage == 0:
        want = DTYPE_NAMES.get(accum)
        have = "fp16" if _enabled(config, "fp16") else "bf16" if _enabled(config, bf) else "fp32"
        if want is not None and want != have:
            yield _err("DS235", "/data_types/grad_accum_dtype", f"data_types.grad_accum_dtype is {accum!r} but the model "
                       f"trains in {have} without ZeRO: deepspeed.initialize raises NotImplementedError (\"unsupported "
                       "mix of model_dtype and grad_accum_dtype\"); only ZeRO-1 sums bf16 gradients in fp32",
                       "set zero_optimization.stage to 1 (bf16 with fp32 sums), or remove grad_accum_dtype")


def zero_rules(config: dict, ctx: Context) -> Iterable[Finding]:
    stage = _stage(config)
    z = "/zero_optimization"
    opt_dev = _get(config, "zero_optimization", "offload_optimizer", "device", kind=str)
    par_dev = _get(config, "zero_optimization", "offload_param", "device", kind=str)
    if opt_dev in ("cpu", "nvme") and stage == 0:
        yield _err("DS205", f"{z}/offload_optimizer/device", f"offload_optimizer to {opt_dev} with ZeRO stage 0: "
                   "ZeRO stays off and DeepSpeed silently swaps in its CPU optimizer without partitioning",
                   "set zero_optimization.stage to 1, 2 or 3, or remove offload_optimizer")
    if opt_dev == "nvme" and stage in (1, 2):
        yield _err("DS205", f"{z}/offload_optimizer/device", f"offload_optimizer to nvme needs ZeRO stage 3; stage "
                   f"{stage} silently treats it as CPU offload and never touches nvme_path",
                   'use "device": "cpu", or stage 3')
    if par_dev in ("cpu", "nvme") and stage != 3:
        yield _err("DS205", f"{z}/offload_param/device", f"offload_param needs ZeRO stage 3; with stage {stage} "
                   "DeepSpeed silently ignores it and parameters stay on the GPU",
                   "set zero_optimization.stage to 3, or remove offload_param")
    for section, dev in (("offload_optimizer", opt_dev), ("offload_param", par_dev)):
        if dev == "nvme" and not _get(config, "zero_optimization", section, "nvme_path", kind=str):
            yield _err("DS206", f"{z}/{section}/nvme_path", f'{section}.device is "nvme" but nvme_path is not set: '
                       "deepspeed.initialize fails (an assert or os.path.join(None, ...))",
                       f"set zero_optimization.{section}.nvme_path to a directory on the NVMe drive")
    ratio = _get(config, "zero_optimization", "offload_optimizer", "ratio", kind=float)
    if ratio is not None and ratio < 1 and stage != 3:
        yield _err("DS216", f"{z}/offload_optimizer/ratio", f"offload_optimizer.ratio {ratio} < 1 needs ZeRO stage 3",
                   "set ratio to 1.0 or use stage 3")
    if _get(config, "zero_optimization", "compute_grad_norm", kind=bool) is False:
        if stage not in (1, 2):
            yield _err("DS214", f"{z}/compute_grad_norm", "compute_grad_norm: false is only allowed with ZeRO stage "
                       f"1 or 2 (stage is {stage})", "remove compute_grad_norm")
        else:
            clip = _get(config, "gradient_clipping", kind=float)
            if clip is None or clip > 0:
                yield _err("DS214", f"{z}/compute_grad_norm", "compute_grad_norm: false needs gradient_clipping 0 "
                           f"(it is {1.0 if clip is None else clip}{'; DeepSpeed defaults it to 1.0' if clip is None else ''}):"
                           " deepspeed.initialize refuses", 'set "gradient_clipping": 0')
            if opt_dev in ("cpu", "nvme"):
                yield _err("DS214", f"{z}/compute_grad_norm", "compute_grad_norm: false cannot be used with "
                           "offload_optimizer", "remove one of them")
    op = _get(config, "gradient_allreduce_op", kind=str)
    if op and op.lower() == "sum" and stage == 3:
        yield _err("DS217", "/gradient_allreduce_op", 'gradient_allreduce_op "sum" is not supported with ZeRO-3',
                   'use "mean"')
    if ctx.pipeline_stages > 1 and stage >= 2:
        yield _err("DS207", f"{z}/stage", f"ZeRO stage {stage} with {ctx.pipeline_stages} pipeline stages: "
                   "DeepSpeed's pipeline engine refuses ZeRO-2/3, after it has built the ZeRO optimizer",
                   "use ZeRO stage 0 or 1 with pipeline parallelism")
    if _get(config, "managed_gradient_accumulation", kind=bool) is False:
        if ctx.pipeline_stages > 1:
            yield _err("DS230", "/managed_gradient_accumulation", "managed_gradient_accumulation: false is "
                       "incompatible with the pipeline engine", "remove it")
        overlap = _get(config, "zero_optimization", "overlap_comm", kind=bool)
        if (overlap or (overlap is None and stage == 3)) and stage != 2:
            yield _err("DS230", "/managed_gradient_accumulation", "managed_gradient_accumulation: false with "
                       "overlap_comm needs ZeRO stage 2", "set overlap_comm false or use stage 2")


# ---------------------------------------------------------------------------- parallelism and misc


def parallel_rules(config: dict, ctx: Context) -> Iterable[Finding]:
    autotp = _get(config, "tensor_parallel", "autotp_size", kind=int)
    if autotp and autotp > 1 and ctx.world_size is not None and ctx.world_size % autotp:
        yield _err("DS208", "/tensor_parallel/autotp_size", f"autotp_size {autotp} does not divide world size "
                   f"{ctx.world_size}: DeepSpeed builds the mesh with dp = world // autotp and fails with a bare "
                   "AssertionError", f"use an autotp_size that divides {ctx.world_size}: "
                   + ", ".join(str(d) for d in _divisors(ctx.world_size) if d > 1))
    if autotp and autotp > 1 and ctx.tensor_parallel > 1 and autotp != ctx.tensor_parallel:
        yield _err("DS208", "/tensor_parallel/autotp_size", f"autotp_size {autotp} != --tensor-parallel "
                   f"{ctx.tensor_parallel}", "make them agree")
    tp_size = _get(config, "tensor_parallel", "tp", "tp_size", kind=int)
    tp_ptr = "/tensor_parallel/tp/tp_size"
    if tp_size is None:
        tp_size = _get(config, "tensor_parallel", "tensor_parallel", "tp_size", kind=int)
        tp_ptr = "/tensor_parallel/tensor_parallel/tp_size"
    if autotp and autotp > 1 and tp_size and tp_size not in (1, autotp):
        yield _err("DS228", tp_ptr, f"tp_size {tp_size} must be 1 or equal autotp_size {autotp}",
                   f"set tp_size to {autotp} or remove it")
    if "comms_logger" in config and _get(config, "comms_logger", "enabled", kind=bool) is not True:
        yield _err("DS218", "/comms_logger", "comms_logger is present but not enabled: DeepSpeed turns "
                   "communication logging on whenever the key exists (comms_logging.py:79)",
                   "remove the comms_logger block to turn logging off", severity="warning")
    for key in ("stages", "partition", "seed_layers"):
        if isinstance(config.get("pipeline"), dict) and key in config["pipeline"]:
            yield _err("DS231", f"/pipeline/{key}", f"pipeline.{key} is never read from the config: it is a "
                       "PipelineModule constructor argument", f"pass {key} to PipelineModule(...) and remove it",
                       severity="warning")
    if _get(config, "aio", "use_gds", kind=bool):
        yield _err("DS234", "/aio/use_gds", "aio.use_gds asserts a CUDA accelerator when the config is parsed",
                   "only set it on CUDA hosts with GPUDirect Storage", severity="warning")
    if _enabled(config, "data_efficiency") or "data_efficiency" in config:
        cl = _get(config, "data_efficiency", "data_sampling", "curriculum_learning", kind=dict)
        if cl and cl.get("enabled") is True and "curriculum_metrics" not in cl:
            yield _err("DS222", "/data_efficiency/data_sampling/curriculum_learning", "curriculum learning is enabled "
                       "without curriculum_metrics: DeepSpeedConfig asserts", "add curriculum_metrics")
        db = _get(config, "data_efficiency", "data_sampling", "dynamic_batching", kind=dict)
        if db and db.get("enabled") is True and "max_tokens" not in db:
            yield _err("DS222", "/data_efficiency/data_sampling/dynamic_batching", "dynamic batching is enabled "
                       "without max_tokens: DeepSpeedConfig asserts", "add max_tokens")
    fp16 = _get(config, "fp16", kind=dict)
    scale = _get(config, "fp16", "loss_scale", kind=float)
    if scale is not None and (scale < 0 or scale in (float("inf"), float("-inf"))):
        yield _err("DS104", "/fp16/loss_scale", f"fp16.loss_scale is {scale}; it must be a finite number >= 0 "
                   "(0 = dynamic loss scaling)", "use 0 for dynamic scaling or a positive static scale")
    if fp16 and fp16.get("enabled") is True and _get(config, "fp16", "loss_scale", kind=float) in (None, 0):
        window = _get(config, "fp16", "loss_scale_window", kind=float)
        if window is not None and window <= 0:
            yield _err("DS221", "/fp16/loss_scale_window", "loss_scale_window must be > 0 with dynamic loss scaling",
                       "use e.g. 1000")
        min_scale = _get(config, "fp16", "min_loss_scale", kind=float)
        if min_scale is not None and min_scale <= 0:
            yield _err("DS221", "/fp16/min_loss_scale", "min_loss_scale must be > 0 with dynamic loss scaling",
                       "use e.g. 1")


# ---------------------------------------------------------------------------- optimizer and scheduler

_ZERO_TESTED_TORCH = {"Adam", "AdamW", "Adagrad"}
"""torch optimizers in ZeRO's ``ZERO_SUPPORTED_OPTIMIZERS`` (``runtime/zero/utils.py``)."""


def optimizer_rules(config: dict, ctx: Context) -> Iterable[Finding]:
    opt = _get(config, "optimizer", kind=dict)
    if opt is None or not isinstance(opt.get("type"), str):
        return
    name = opt["type"]
    names = load_schema()["x-dstk-optimizers"]
    if name.lower() in names["deepspeed"]:
        key, ds = name.lower(), True
    elif name in names["torch"]:
        key, ds = f"torch.{name}", False
    else:
        guess = did_you_mean(name, names["torch"] + names["deepspeed"])
        hint = f"did you mean '{guess}'?" if guess else "use one of: " + ", ".join(names["deepspeed"] + names["torch"])
        if guess and guess.lower() == name.lower():
            hint = f"torch optimizer names are case-sensitive: write '{guess}'"
        yield _err("DS209", "/optimizer/type", f"optimizer '{name}' is neither a DeepSpeed optimizer nor a "
                   "torch.optim class: the parse accepts it, deepspeed.initialize fails", hint)
        return
    params = _get(config, "optimizer", "params", kind=dict) or {}
    if "max_grad_norm" in params:
        yield _err("DS213", "/optimizer/params/max_grad_norm", "max_grad_norm in optimizer params: DeepSpeed "
                   "warns at parse and raises ValueError at initialize", "use top-level gradient_clipping")
        params = {k: v for k, v in params.items() if k != "max_grad_norm"}
    yield from findings_for(params, base="/optimizer/params", schema_pointer=f"/$defs/optimizer_params/{key}",
                            what=f"optimizer '{name}'")
    if not ds and _stage(config) > 0 and name not in _ZERO_TESTED_TORCH and not config.get(
            "zero_allow_untested_optimizer") and not ctx.hf:
        yield _err("DS219", "/optimizer/type", f"torch.optim.{name} with ZeRO stage {_stage(config)}: "
                   "deepspeed.initialize refuses an optimizer ZeRO was not tested with",
                   'set "zero_allow_untested_optimizer": true, or use Adam/AdamW')
    if key == "lamb" and _enabled(config, "fp16") and (_get(config, "fp16", "loss_scale", kind=float) or 0) != 0:
        yield _err("DS225", "/fp16/loss_scale", "the Lamb optimizer needs dynamic loss scaling (fp16.loss_scale 0)",
                   "set fp16.loss_scale to 0")


def scheduler_rules(config: dict, ctx: Context) -> Iterable[Finding]:
    sched = _get(config, "scheduler", kind=dict)
    if sched is None or not isinstance(sched.get("type"), str):
        return
    name = sched["type"]
    names = load_schema()["x-dstk-schedulers"]
    if name in names["deepspeed"]:
        key = name
    elif name in names["torch"]:
        key = f"torch.{name}"
    else:
        guess = did_you_mean(name, names["deepspeed"] + names["torch"])
        yield _err("DS211", "/scheduler/type", f"scheduler '{name}' is not in deepspeed.runtime.lr_schedules or "
                   "torch.optim.lr_scheduler (names are case-sensitive): deepspeed.initialize fails after building "
                   "the optimizer", f"did you mean '{guess}'?" if guess else
                   "use one of: " + ", ".join(names["deepspeed"]))
        return
    params = _get(config, "scheduler", "params", kind=dict) or {}
    found = findings_for(params, base="/scheduler/params", schema_pointer=f"/$defs/scheduler_params/{key}",
                         what=f"scheduler '{name}'")
    if ctx.hf:  # the Trainer fills these when they are "auto" (already taken out)
        found = [f for f in found if not (f.code == "DS110" and f.pointer in ctx.auto_pointers)]
    yield from found


RULES: tuple[Callable[[dict, Context], Iterable[Finding]], ...] = (
    deprecated, batch_triad, precision, zero_rules, parallel_rules, optimizer_rules, scheduler_rules)
