"""An existing DeepSpeed config, read into what ``dstk.estimate.estimate`` takes.

``read_settings(config, ...)`` reads what a DeepSpeed 0.19.8 config sets (ZeRO stage and its buffer
knobs, offload, the batch triad, precision, optimizer, AutoTP size) with DeepSpeed's defaults for the
rest (``deepspeed/runtime/zero/config.py``, ``deepspeed/runtime/config.py``) and transformers' fill
rule for ``"auto"`` (``transformers/integrations/deepspeed.py`` ``trainer_config_process`` /
``trainer_config_finalize``). ``to_layout(settings, ...)`` then combines it with the cluster and
the command line into a ``Layout``: a flag that contradicts the file is an error naming both
values, never a silent override.

Pure: no torch, no DeepSpeed; the file itself is parsed by ``dstk.validate.source`` as DeepSpeed
parses it (hjson, duplicate keys rejected).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from dstk.errors import DstkError
from dstk.estimate.buckets import elements_text
from dstk.estimate.memory import ZeroBuffers
from dstk.layout import Layout

AUTO = "auto"

_DS_OPTIMIZERS = {  # DeepSpeed's own names, matched lower-case (``config.py`` DEEPSPEED_OPTIMIZERS)
    "adamw": ("adamw", None), "lamb": ("adamw", "Lamb keeps two fp32 states per parameter, as AdamW"),
    "lion": ("lion", None), "muadamw": ("adamw", None), "muadam": ("adamw", None),
    "musgd": ("sgd", None), "adagrad": ("sgd", "Adagrad keeps one fp32 state per parameter: priced as SGD"),
    "muon": ("sgd", "Muon keeps one momentum buffer per matrix: priced as SGD with momentum"),
}
_TORCH_OPTIMIZERS = {  # torch.optim names, looked up as written (case-sensitive)
    "SGD": ("sgd", None), "Adafactor": ("adafactor", None),
    "RMSprop": ("sgd", "RMSprop keeps one fp32 state per parameter: priced as SGD"),
}

_ZERO_KNOBS = (  # ZeroBuffers field, keys (name, alias), minimum
    ("reduce_bucket_size", ("reduce_bucket_size",), 1),
    ("allgather_bucket_size", ("allgather_bucket_size",), 0),
    ("prefetch_bucket_size", ("stage3_prefetch_bucket_size", "prefetch_bucket_size"), 0),
    ("param_persistence_threshold", ("stage3_param_persistence_threshold", "param_persistence_threshold"), 0),
    ("max_live_parameters", ("stage3_max_live_parameters", "max_live_parameters"), 0),
    ("max_reuse_distance", ("stage3_max_reuse_distance", "max_reuse_distance"), 0),
)


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class ConfigSettings:
    """What one DeepSpeed config sets, in dstk's words. ``None`` means the file leaves it to someone
    else: "auto" (transformers' Trainer fills it) or absent where DeepSpeed derives it."""

    zero_stage: int | None
    """None only for ``"stage": "auto"`` (accelerate fills it; DeepSpeed alone reads it as 0)."""
    offload_optimizer: str = "none"
    offload_params: str = "none"
    micro_batch: int | None = None
    """``train_micro_batch_size_per_gpu``."""
    grad_accum: int | None = None
    """``gradient_accumulation_steps``."""
    train_batch: int | None = None
    """``train_batch_size``."""
    tp: int = 1
    """``tensor_parallel.autotp_size`` (0 and 1: no AutoTP)."""
    pipeline_checkpoint_interval: int | None = None
    """``pipeline.activation_checkpoint_interval``; None without a ``pipeline`` block."""
    precision: str | None = "fp32"
    """bf16 / fp16 / fp32 (neither block enabled); None: ``enabled`` is "auto"."""
    optimizer: str | None = None
    """dstk's optimizer family; None: no ``optimizer`` block (the script passes its own)."""
    buffers: ZeroBuffers = ZeroBuffers()
    auto_batch: frozenset[str] = frozenset()
    """Which of micro_batch, grad_accum, train_batch are "auto" (transformers fills them from
    ``TrainingArguments``); absent ones DeepSpeed derives from the other two."""
    notes: tuple[str, ...] = ()
    """What dstk filled or assumed, one line each (shown with the estimate)."""
    pointers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Setting name -> the JSON pointer it came from, for error messages."""


def _where(pointer: str, positions: Mapping[str, tuple[int, int]], source: str) -> str:
    line = positions.get(pointer)
    at = f"{source}:{line[0]}:{line[1]}" if line else source
    return f"{at} {pointer}" if pointer else at


class _Reader:
    def __init__(self, config: dict, positions: Mapping[str, tuple[int, int]], source: str):
        self.config, self.positions, self.source = config, positions, source
        self.notes: list[str] = []
        self.pointers: dict[str, str] = {}

    def fail(self, pointer: str, message: str, hint: str) -> DstkError:
        return DstkError(message, hint=hint, location=_where(pointer, self.positions, self.source))

    def section(self, *keys: str) -> tuple[dict, str]:
        """The object at ``keys`` (empty when absent) and its pointer; not an object is an error."""
        node, pointer = self.config, ""
        for key in keys:
            pointer += f"/{key}"
            node = node.get(key, {}) if isinstance(node, dict) else {}
            if node is None:
                node = {}
            if not isinstance(node, dict):
                raise self.fail(pointer, f"{pointer} is {type(node).__name__} {node!r}, not an object",
                                f'write it as an object, e.g. "{key}": {{...}}')
        return node, pointer

    def integer(self, node: dict, key: str, pointer: str, *, minimum: int, auto: bool = True):
        """An integer value as DeepSpeed's pydantic fields take it (5e8 is fine, 2.5 and "8" are not);
        None when absent; AUTO when "auto" and ``auto``."""
        if key not in node:
            return None
        value, at = node[key], f"{pointer}/{key}"
        if value == AUTO and auto:
            return AUTO
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise self.fail(at, f"{key} is {value!r}: DeepSpeed expects a whole number",
                            f"write a number, e.g. \"{key}\": {max(minimum, 1)}"
                            + (' (or "auto" under transformers\' Trainer)' if auto else ""))
        if value < minimum:
            raise self.fail(at, f"{key} is {value!r}: DeepSpeed needs at least {minimum}",
                            f"write a number >= {minimum}")
        self.pointers[key] = at
        return int(value)

    def boolean(self, node: dict, key: str, pointer: str):
        if key not in node or node[key] is None:
            return None
        value = node[key]
        if not isinstance(value, bool):
            raise self.fail(f"{pointer}/{key}", f"{key} is {value!r}: DeepSpeed expects true or false",
                            f'write "{key}": true or false (JSON booleans, not strings)')
        return value


def read_settings(config: object, *, hidden_size: int | None = None,
                  positions: Mapping[str, tuple[int, int]] | None = None, source: str = "config") -> ConfigSettings:
    """Read a parsed DeepSpeed config (a dict). ``hidden_size`` fills the "auto" bucket sizes the
    way transformers' Trainer does (``reduce_bucket_size = hidden**2``; under ZeRO-3
    ``stage3_prefetch_bucket_size = int(0.9 * hidden**2)`` and
    ``stage3_param_persistence_threshold = 10 * hidden``, ``integrations/deepspeed.py``);
    ``positions`` (``dstk.validate.source.Document.positions``) and ``source`` locate errors.
    Every problem is a ``DstkError`` with the location and a fix."""
    positions = positions or {}
    if not isinstance(config, dict):
        raise DstkError(f"the top level is {type(config).__name__}, not a JSON object", location=source,
                        hint='a DeepSpeed config is one object: {"train_micro_batch_size_per_gpu": 1, ...}')
    r = _Reader(config, positions, source)
    zero, zp = r.section("zero_optimization")

    stage = zero.get("stage", 0)
    if stage == AUTO:
        stage = None
        r.notes.append('zero_optimization.stage is "auto": accelerate fills it from its plugin, DeepSpeed alone '
                       "reads it as 0")
    elif isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise r.fail(f"{zp}/stage", f"zero_optimization.stage is {stage!r}: DeepSpeed accepts 0, 1, 2 or 3",
                     'write "stage": 0, 1, 2 or 3')
    else:
        r.pointers["zero_stage"] = f"{zp}/stage"

    offload = {}
    for kind, key, old in (("optimizer", "offload_optimizer", "cpu_offload"), ("params", "offload_param",
                                                                                "cpu_offload_param")):
        block, bp = r.section("zero_optimization", key)
        device = block.get("device", "none")
        if device in (None, AUTO):
            if device == AUTO:
                r.notes.append(f'{key}.device is "auto": DeepSpeed reads it as "none" (no offload); accelerate '
                               "fills it from its plugin")
            device = "none"
        if device not in ("none", "cpu", "nvme"):
            raise r.fail(f"{bp}/device", f"{key}.device is {device!r}", 'write "cpu", "nvme" or "none"')
        if device != "none":
            r.pointers[f"offload_{kind}"] = f"{bp}/device"
        if device == "none" and r.boolean(zero, old, zp):
            device = "cpu"  # deprecated form, mapped by DeepSpeed's ``new_param_fn``
            r.pointers[f"offload_{kind}"] = f"{zp}/{old}"
            r.notes.append(f"{old}: true is the deprecated form of {key}: {{\"device\": \"cpu\"}}")
        offload[kind] = device
        ratio = block.get("ratio")
        if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and ratio < 1:
            r.notes.append(f"{key}.ratio {ratio}: partial offload is priced as full offload")

    knobs: dict = {}
    for field, keys, minimum in _ZERO_KNOBS:
        present = [k for k in keys if k in zero]
        if len(present) > 1:
            raise r.fail(f"{zp}/{present[1]}", f"{present[0]} and {present[1]} are the same setting",
                         f"keep one of them ({present[0]})")
        if not present:
            continue
        value = r.integer(zero, present[0], zp, minimum=minimum)
        knobs[field] = (value, f"{zp}/{present[0]}", present[0])
    for field in ("overlap_comm", "contiguous_gradients", "reduce_scatter", "use_multi_rank_bucket_allreduce"):
        if zero.get(field) == AUTO:
            r.notes.append(f'{field} is "auto": transformers does not fill it; DeepSpeed uses its default')
            continue
        value = r.boolean(zero, field, zp)
        if value is not None:
            knobs[field] = (value, f"{zp}/{field}", field)

    buffers = ZeroBuffers()
    changes = {}
    for field, (value, pointer, key) in knobs.items():
        if value != AUTO:
            changes[field] = value
            continue
        hf_rule = {"reduce_bucket_size": (lambda h: h * h, "hidden_size**2")}
        if stage == 3:
            hf_rule.update(prefetch_bucket_size=(lambda h: int(0.9 * h * h), "int(0.9 * hidden_size**2)"),
                           param_persistence_threshold=(lambda h: 10 * h, "10 * hidden_size"))
        if field not in hf_rule:
            r.notes.append(f'{key} is "auto": transformers does not fill it here; DeepSpeed uses its default '
                           f"{elements_text(getattr(buffers, field))}")
            continue
        if not hidden_size:
            raise r.fail(pointer, f'{key} is "auto", which transformers fills from the model\'s hidden_size, '
                                  "and the model's hidden size is unknown",
                         "give the model by name or dimensions (--model, --hidden-size ...), or write a number")
        fill, words = hf_rule[field]
        changes[field] = fill(hidden_size)
        r.notes.append(f'{key} "auto" = {words} = {changes[field]:,} (transformers\' Trainer); plain '
                       f"deepspeed.initialize would use {elements_text(getattr(buffers, field))}")
    accum_dtype = (config.get("data_types") or {}).get("grad_accum_dtype") if isinstance(config, dict) else None
    if isinstance(accum_dtype, str):  # BF16_Optimizer or not under a pipeline (memory.bf16_optimizer_in_pipeline)
        changes["grad_accum_dtype"] = accum_dtype.lower()
    buffers = dataclasses.replace(buffers, **changes)

    batch: dict = {}
    auto_batch = set()
    for name, key in (("micro_batch", "train_micro_batch_size_per_gpu"), ("grad_accum", "gradient_accumulation_steps"),
                      ("train_batch", "train_batch_size")):
        value = r.integer(config, key, "", minimum=1)
        batch[name] = None if value == AUTO else value
        if value == AUTO:
            auto_batch.add(name)
        if value is not None and value != AUTO:
            r.pointers[name] = f"/{key}"

    tp_block, tpp = r.section("tensor_parallel")
    tp = r.integer(tp_block, "autotp_size", tpp, minimum=0, auto=False) or 1
    if tp > 1:
        r.pointers["tp"] = f"{tpp}/autotp_size"
    pipe_interval = None
    if "pipeline" in config:
        pipe, pp_ptr = r.section("pipeline")
        pipe_interval = r.integer(pipe, "activation_checkpoint_interval", pp_ptr, minimum=0, auto=False) or 0

    return ConfigSettings(
        zero_stage=stage, offload_optimizer=offload["optimizer"], offload_params=offload["params"],
        tp=tp, pipeline_checkpoint_interval=pipe_interval, precision=_precision(r), optimizer=_optimizer(r),
        buffers=buffers, auto_batch=frozenset(auto_batch), notes=tuple(r.notes), pointers=dict(r.pointers), **batch)


def _precision(r: _Reader) -> str | None:
    enabled = {}
    for name, keys in (("bf16", ("bf16", "bfloat16")), ("fp16", ("fp16",))):
        key = next((k for k in keys if k in r.config), keys[0])  # DeepSpeed reads "bfloat16" when "bf16" is absent
        block, bp = r.section(key)
        value = block.get("enabled", False)
        if value != AUTO and not isinstance(value, bool):
            raise r.fail(f"{bp}/enabled", f"{key}.enabled is {value!r}: DeepSpeed expects true or false",
                         f'write "{key}": {{"enabled": true}}')
        enabled[name] = (value, f"{bp}/enabled")
    on = [n for n, (v, _) in enabled.items() if v is True]
    if len(on) == 2:
        raise r.fail(enabled["fp16"][1], "fp16 and bf16 are both enabled: DeepSpeed refuses the config",
                     "enable one of them")
    if on:
        r.pointers["precision"] = enabled[on[0]][1]
        return on[0]
    if any(v == AUTO for v, _ in enabled.values()):
        return None
    return "fp32"


def _optimizer(r: _Reader) -> str | None:
    block, bp = r.section("optimizer")
    if not block:
        return None
    kind = block.get("type")
    if not isinstance(kind, str) or kind == AUTO:
        raise r.fail(f"{bp}/type" if "type" in block else bp, f"optimizer.type is {kind!r}",
                     'name the optimizer, e.g. "type": "AdamW" (DeepSpeed\'s names or torch.optim\'s)')
    r.pointers["optimizer"] = f"{bp}/type"
    params = block.get("params") or {}
    if kind.lower() == "adam":
        return "adam" if isinstance(params, dict) and params.get("adam_w_mode") is False else "adamw"
    found = _DS_OPTIMIZERS.get(kind.lower()) or _TORCH_OPTIMIZERS.get(kind)
    if found is None:
        near = next((k for k in _TORCH_OPTIMIZERS if k.lower() == kind.lower()), None)
        hint = (f'torch optimizers are looked up as written: "type": "{near}"' if near else
                "use one of Adam, AdamW, Lamb, Lion, Adagrad, Muon (DeepSpeed) or SGD, Adafactor, RMSprop (torch)")
        raise r.fail(f"{bp}/type", f"optimizer.type {kind!r}: DeepSpeed 0.19.8 would fail at initialize", hint)
    family, note = found
    if note:
        r.notes.append(note)
    return family


def _conflict(what: str, flag_value, file_value, pointer: str, source: str,
              positions: Mapping[str, tuple[int, int]]) -> DstkError:
    return DstkError(f"--{what.replace('_', '-')} {flag_value} contradicts the config, which sets {file_value}",
                     location=_where(pointer, positions, source),
                     hint=f"drop --{what.replace('_', '-')} (the file decides), or edit the file")


def to_layout(settings: ConfigSettings, *, world_size: int, flags: Mapping[str, object],
              fallback: Mapping[str, object] | None = None, pp: int = 1, recompute: str | None = None,
              positions: Mapping[str, tuple[int, int]] | None = None,
              source: str = "config") -> tuple[Layout, str, str, tuple[str, ...]]:
    """(Layout, precision, optimizer, notes) for a config run on ``world_size`` GPUs.

    ``flags`` are the command line's values (None when not given) for ``zero``, ``offload_optimizer``,
    ``offload_params``, ``tp``, ``micro_batch``, ``global_batch``, ``precision``, ``optimizer``; one that
    contradicts the file is an error naming both. ``fallback`` (an intent's ``global_batch``,
    ``precision``, ``optimizer``) fills only what the file leaves "auto" or unset. The batch triad
    follows DeepSpeed's ``_set_batch_related_parameters`` / ``_batch_assertion`` (``config.py``):
    what is missing is derived from the other two and the data-parallel size, and
    ``train_batch_size == micro x accumulation x dp`` must hold.
    """
    positions, fallback = positions or {}, fallback or {}
    s, notes = settings, list(settings.notes)
    # What DeepSpeed runs is what the file says (its defaults where it is silent); only "auto" and a
    # missing optimizer block or batch size leave room for the command line.
    file_values = {"zero": s.zero_stage, "offload_optimizer": s.offload_optimizer, "offload_params": s.offload_params,
                   "tp": s.tp, "micro_batch": s.micro_batch, "precision": s.precision, "optimizer": s.optimizer}
    for what, value in file_values.items():
        flag = flags.get(what)
        if flag is not None and value is not None and flag != value:
            pointer = s.pointers.get("zero_stage" if what == "zero" else what, "")
            if not pointer:
                value = {"precision": "fp32 (neither bf16 nor fp16 is enabled)",
                         "tp": "no AutoTP (no tensor_parallel.autotp_size)"}.get(what, f"{value} (DeepSpeed's default)")
            raise _conflict(what, flag, value, pointer, source, positions)

    def pick(what: str, default):
        """The file's value, else the flag's, else the intent's (with a note where the intent differs)."""
        value = file_values[what]
        if value is not None:
            wanted = fallback.get(what)
            if flags.get(what) is None and wanted is not None and wanted != value:
                notes.append(f"the intent says {what} {wanted}; the config's {value} is what DeepSpeed runs")
            return value
        if flags.get(what) is not None:
            return flags[what]
        return fallback.get(what, default)

    zero = pick("zero", None)
    if zero is None:
        raise DstkError('zero_optimization.stage is "auto" and no --zero was given',
                        location=_where("/zero_optimization/stage", positions, source),
                        hint="pass --zero 0-3, or write the stage in the file")
    tp = pick("tp", 1)
    offload_opt = pick("offload_optimizer", "none")
    offload_par = pick("offload_params", "none")
    precision = pick("precision", None)
    if precision is None:
        raise DstkError('bf16/fp16 "enabled" is "auto" and no --precision was given',
                        location=source, hint="pass --precision bf16|fp16|fp32 (transformers fills it from "
                                              "TrainingArguments.bf16 / fp16)")
    optimizer = pick("optimizer", None)
    if optimizer is None:
        optimizer = "adamw"
        notes.append("no optimizer block: the script passes its own optimizer; priced as AdamW (say --optimizer)")

    if world_size % (tp * pp):
        raise DstkError(f"{world_size} GPUs do not divide into autotp_size {tp} x pp {pp}",
                        location=_where(s.pointers.get("tp", ""), positions, source),
                        hint="choose a tensor-parallel size and pipeline stages whose product divides the GPUs")
    dp = world_size // (tp * pp)
    micro, accum, train = s.micro_batch, s.grad_accum, s.train_batch
    micro = micro if micro is not None else flags.get("micro_batch")
    # --global-batch and the intent count data-parallel replicas; train_batch_size under AutoTP
    # counts every rank (see parse_dp below), so they compare after multiplying by tp.
    flag_global = flags.get("global_batch")
    if flag_global is not None and train is not None and flag_global * tp != train:
        raise _conflict("global_batch", flag_global, f"train_batch_size {train}" + (f" ({train // tp} x tp {tp})"
                        if tp > 1 else ""), s.pointers.get("train_batch", ""), source, positions)
    if train is None and flag_global is not None:
        train = flag_global * tp
    elif train is None and "train_batch" in s.auto_batch and fallback.get("global_batch") is not None:
        # transformers fills world x per-device batch x accumulation: every rank, TP ranks included,
        # while the intent's global batch counts data-parallel replicas.
        train = fallback["global_batch"] * tp
    if s.micro_batch is None and "micro_batch" in s.auto_batch and flags.get("micro_batch") is None:
        notes.append('train_micro_batch_size_per_gpu is "auto" (TrainingArguments.per_device_train_batch_size): '
                     "derived from the global batch; pass --micro-batch to price the one you train with")
    # DeepSpeed's parse checks the triad against the data-parallel size it sees: under AutoTP that is
    # every rank (no mpu at parse, research notes §1.1); the engine then runs world / tp replicas.
    parse_dp = dp * tp

    def said(name: str, value):  # "auto" as the file says it, not None
        return '"auto"' if value is None and name in s.auto_batch else value

    triad = (f"train_batch_size {said('train_batch', train)}, train_micro_batch_size_per_gpu "
             f"{said('micro_batch', micro)}, gradient_accumulation_steps {said('grad_accum', accum)}")
    if micro is not None and accum is not None:
        derived = micro * accum * parse_dp
        if train is not None and train != derived:
            near = sorted({micro * parse_dp * max(1, train // (micro * parse_dp)),
                           micro * parse_dp * (train // (micro * parse_dp) + 1)})
            raise DstkError(f"the batch triad does not hold on {world_size} GPUs: train_batch_size {train} != "
                            f"{micro} x {accum} x {parse_dp} (micro x accumulation x data-parallel ranks"
                            f"{' as DeepSpeed counts them under AutoTP' if tp > 1 else ''})",
                            location=_where(s.pointers.get("train_batch", ""), positions, source),
                            hint=f"DeepSpeed's assert fails at initialize; write train_batch_size {derived}, "
                                 f"or leave it out (DeepSpeed derives it); valid sizes near it: "
                                 f"{', '.join(map(str, near))}")
    elif train is not None and micro is not None:
        accum = train // micro // parse_dp
        if accum < 1 or accum * micro * parse_dp != train:
            raise DstkError(f"the batch triad does not hold on {world_size} GPUs: train_batch_size {train} is not "
                            f"a multiple of micro-batch x data-parallel ranks = {micro} x {parse_dp}",
                            location=_where(s.pointers.get("train_batch", ""), positions, source),
                            hint=f"use a train_batch_size that is a multiple of {micro * parse_dp}, e.g. "
                                 f"{micro * parse_dp * max(1, train // (micro * parse_dp))}")
    elif train is not None:
        accum = accum or 1
        micro = train // parse_dp // accum
        if micro < 1 or micro * accum * parse_dp != train:
            raise DstkError(f"the batch triad does not hold on {world_size} GPUs: train_batch_size {train} is not "
                            f"a multiple of accumulation x data-parallel ranks = {accum} x {parse_dp}",
                            location=_where(s.pointers.get("train_batch", ""), positions, source),
                            hint=f"use a multiple of {accum * parse_dp}")
    elif micro is not None:
        accum = accum or 1
    else:
        raise DstkError(f"no batch size: {triad}",
                        location=source, hint="write train_micro_batch_size_per_gpu (and gradient_accumulation_steps)"
                                              " in the file, or pass --micro-batch / --global-batch")
    interval = s.pipeline_checkpoint_interval
    if interval is not None and pp == 1:
        notes.append("the config has a pipeline block; its stages are PipelineModule's num_stages, not in the "
                     "file: pass --pp N to price the pipeline")
    if recompute is None:
        recompute = "full" if (pp > 1 and interval) else "none"
    try:
        layout = Layout(dp=dp, tp=tp, pp=pp, zero_stage=zero, offload_optimizer=offload_opt,
                        offload_params=offload_par, micro_batch=micro, grad_accum=accum, recompute=recompute)
    except ValueError as exc:
        raise DstkError(f"the config cannot run as read: {exc}", location=source,
                        hint="fix the ZeRO stage / offload combination in the file, or the --pp/--tp flags") from None
    return layout, precision, optimizer, tuple(notes)
