"""A user's training intent: which model, on which cluster, trained how, under which constraints.

An intent is a small YAML file with four sections (``model``, ``cluster``, ``training``,
``constraints``); the same fields can be given as command-line flags, and flags win. Loading is
strict: an unknown key or an impossible value is a ``DstkError`` that names the field
(``training.seq_len``) and says how to fix it. Everything here is pure data; resolving a model
preset or a GPU slug into figures is the job of ``dstk.models`` and ``dstk.hardware``.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from typing import Any, Literal

from dstk.errors import DstkError, UsageError
from dstk.layout import ATTENTIONS, OFFLOADS, OPTIMIZERS, PRECISIONS, RECOMPUTES, Training

Schedule = Literal["cosine", "linear", "constant"]
Engine = Literal["deepspeed", "megatron"]
SCHEDULES: tuple[str, ...] = ("cosine", "linear", "constant")
ENGINES: tuple[str, ...] = ("deepspeed", "megatron")
# The dimensions a generic GPT-style decoder needs, when no preset or HF config names it.
REQUIRED_DIMS: tuple[str, ...] = ("num_layers", "hidden_size", "num_heads", "vocab_size")


def _positive(name: str, value, *, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")


def _choice(name: str, value, choices: tuple[str, ...], *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(choices)}, got {value!r}")


def _fraction(name: str, value, *, low: float, high: float) -> None:
    if not (low <= value < high):
        raise ValueError(f"{name}: expected a number in [{low}, {high}), got {value!r}")


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class ModelIntent:
    """The model: a preset name or an HF config path, or the dimensions of a GPT-style decoder."""

    name: str | None = None
    """A preset (``llama-3-8b``, see ``dstk models``) or a local HF ``config.json`` file or directory."""
    num_layers: int | None = None
    """Transformer layers (dimensions mode)."""
    hidden_size: int | None = None
    """Model width (dimensions mode)."""
    num_heads: int | None = None
    """Attention heads (dimensions mode)."""
    num_kv_heads: int | None = None
    """Key/value heads for grouped-query attention; defaults to num_heads."""
    ffn_hidden_size: int | None = None
    """MLP width; defaults to the family's usual ratio."""
    vocab_size: int | None = None
    """Vocabulary size (dimensions mode)."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size"):
            _positive(f"model.{name}", getattr(self, name))
        dims = [d for d in REQUIRED_DIMS if getattr(self, d) is not None]
        if self.name is not None and dims:
            raise ValueError(f"model.name: give a name or dimensions, not both (also set: {', '.join(dims)})")
        if self.name is None:
            missing = [d for d in REQUIRED_DIMS if getattr(self, d) is None]
            if missing:
                raise ValueError(
                    f"model.{missing[0]}: a model needs a name (preset or HF config path) or all of "
                    f"{', '.join(REQUIRED_DIMS)}; missing {', '.join(missing)}"
                )
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"model.num_heads: hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}"
                )
            if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
                raise ValueError(
                    f"model.num_kv_heads: num_heads {self.num_heads} is not divisible by num_kv_heads {self.num_kv_heads}"
                )


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class ClusterIntent:
    """The machines: how many nodes, how many GPUs each, which GPU and which network."""

    num_nodes: int = 1
    """Nodes (hosts)."""
    gpus_per_node: int = 8
    """GPUs per node; on a CPU-only machine, CPU ranks per node."""
    gpu: str = "h100-sxm"
    """GPU type by slug (``dstk gpus`` lists them), or ``cpu`` for CPU ranks on gloo."""
    interconnect: str | None = None
    """Inter-node network by slug (e.g. ``ib-ndr``); None takes the catalog's default for the GPU."""
    gpu_memory_gib: float | None = None
    """Override the GPU's memory (GiB), for a GPU not in the catalog or a partitioned one."""
    gpu_tflops: float | None = None
    """Override the GPU's dense 16-bit peak (TFLOP/s)."""
    hardware: str | None = None
    """A YAML/JSON file adding or changing GPUs and networks (the same file `dstk estimate --hardware` reads)."""
    host_memory_gib: float | None = None
    """CPU memory of one node (GiB), checked against what CPU offload needs; None: unknown, not checked."""

    def __post_init__(self) -> None:
        _positive("cluster.num_nodes", self.num_nodes, allow_none=False)
        _positive("cluster.gpus_per_node", self.gpus_per_node, allow_none=False)
        if not isinstance(self.gpu, str) or not self.gpu:
            raise ValueError(f"cluster.gpu: expected a GPU slug such as h100-sxm, got {self.gpu!r}")
        for name in ("gpu_memory_gib", "gpu_tflops", "host_memory_gib"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"cluster.{name}: expected a positive number, got {value!r}")

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class TrainingIntent:
    """What one step processes, for how long, with which numerics and optimizer."""

    seq_len: int = 2048
    """Tokens per sequence."""
    global_batch: int | None = None
    """Sequences per optimizer step over all replicas (or give global_batch_tokens)."""
    global_batch_tokens: int | None = None
    """Tokens per optimizer step; must be a multiple of seq_len. Default: about 1M tokens."""
    num_tokens: int | None = None
    """Token budget of the run; sets the number of steps and the time-to-train figure."""
    train_steps: int | None = None
    """Optimizer steps; default num_tokens / tokens per step, else 1000."""
    precision: str | None = None
    """bf16, fp16 or fp32; default bf16 where the GPU has it, else fp16 (V100)."""
    optimizer: str = "adamw"
    """adamw, adam, sgd, lion or adafactor."""
    attention: str = "sdpa"
    """Attention kernel: sdpa, flash or eager (eager materialises the score matrix)."""
    lr: float = 3e-4
    """Peak learning rate."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of lr (cosine and linear schedules)."""
    schedule: str = "cosine"
    """Learning-rate schedule after warmup: cosine, linear or constant."""
    warmup_steps: int = 100
    """Linear warmup steps (at least 1; clipped to train_steps)."""
    weight_decay: float = 0.1
    """Decoupled weight decay (AdamW) or L2 (others)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """Adam/Lion betas."""
    eps: float = 1e-8
    """Adam epsilon."""
    grad_clip: float = 1.0
    """Gradient-norm clipping; 0 turns it off."""

    def __post_init__(self) -> None:
        for name in ("seq_len", "global_batch", "global_batch_tokens", "num_tokens", "train_steps", "warmup_steps"):
            _positive(f"training.{name}", getattr(self, name))
        _choice("training.precision", self.precision, PRECISIONS, allow_none=True)
        _choice("training.optimizer", self.optimizer, OPTIMIZERS)
        _choice("training.attention", self.attention, ATTENTIONS)
        _choice("training.schedule", self.schedule, SCHEDULES)
        if not self.lr > 0:
            raise ValueError(f"training.lr: expected a positive learning rate, got {self.lr!r}")
        _fraction("training.min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0 + 1e-12)
        if self.weight_decay < 0:
            raise ValueError(f"training.weight_decay: expected >= 0, got {self.weight_decay!r}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"training.betas: expected two numbers in [0, 1), got {self.betas!r}")
        if not self.eps > 0:
            raise ValueError(f"training.eps: expected a positive number, got {self.eps!r}")
        if self.grad_clip < 0:
            raise ValueError(f"training.grad_clip: expected >= 0 (0 = off), got {self.grad_clip!r}")
        if self.global_batch is not None and self.global_batch_tokens is not None:
            raise ValueError("training.global_batch: give global_batch or global_batch_tokens, not both")
        if self.global_batch_tokens is not None and self.global_batch_tokens % self.seq_len:
            raise ValueError(
                f"training.global_batch_tokens: {self.global_batch_tokens} is not a multiple of seq_len "
                f"{self.seq_len} -- fix: nearest: {max(1, self.global_batch_tokens // self.seq_len) * self.seq_len} "
                f"or {(self.global_batch_tokens // self.seq_len + 1) * self.seq_len}"
            )

    @property
    def sequences_per_step(self) -> int:
        """Global batch in sequences; default the power of two nearest 1M tokens (at least 1)."""
        if self.global_batch is not None:
            return self.global_batch
        if self.global_batch_tokens is not None:
            return self.global_batch_tokens // self.seq_len
        return max(1, 2 ** round(_log2((1 << 20) / self.seq_len)))

    @property
    def steps(self) -> int:
        if self.train_steps is not None:
            return self.train_steps
        if self.num_tokens is not None:
            return max(1, -(-self.num_tokens // (self.sequences_per_step * self.seq_len)))
        return 1000

    def to_training(self) -> Training:
        """The shared ``Training`` the estimator and renderers speak (an unresolved precision is
        bf16 here; ``dstk.plan.resolve`` sets it from the GPU first)."""
        return Training(
            seq_len=self.seq_len,
            global_batch=self.sequences_per_step,
            precision=self.precision or "bf16",
            optimizer=self.optimizer,
            attention=self.attention,
            num_tokens=self.num_tokens,
        )


def _log2(x: float) -> float:
    import math

    return math.log2(x) if x > 0 else 0.0


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Constraints:
    """Limits on the search, and degrees the user pins (None = let the planner choose)."""

    engine: str = "deepspeed"
    """Which runtime the layout is for: deepspeed (ZeRO 0-3, AutoTP, 1F1B pipeline) or megatron
    (distributed optimizer, TP with sequence parallelism, interleaved pipeline)."""
    offload: bool = True
    """Allow ZeRO-Offload of optimizer states and parameters (``--no-offload`` forbids it)."""
    nvme_path: str | None = None
    """A local NVMe directory; NVMe offload is considered only when this is set."""
    max_tp: int | None = None
    """Largest tensor-parallel degree to consider."""
    tp_across_nodes: bool = False
    """Allow a TP group to span nodes (slow: TP all-reduces every layer)."""
    memory_headroom: float = 0.1
    """Fraction of each GPU's memory, beyond the fixed CUDA context/NCCL overhead, kept free for fragmentation."""
    dp: int | None = None
    """Pin the data-parallel degree."""
    tp: int | None = None
    """Pin the tensor-parallel degree."""
    pp: int | None = None
    """Pin the pipeline-parallel degree."""
    zero_stage: int | None = None
    """Pin the ZeRO stage (0-3)."""
    micro_batch: int | None = None
    """Pin the micro-batch size."""
    recompute: str | None = None
    """Pin activation recomputation: none, selective or full."""
    offload_optimizer: str | None = None
    """Pin where optimizer states live: none, cpu or nvme."""
    offload_params: str | None = None
    """Pin where parameters live: none, cpu or nvme."""
    virtual_stages: int | None = None
    """Pin interleaved pipeline chunks per rank (megatron engine)."""

    def __post_init__(self) -> None:
        _choice("constraints.engine", self.engine, ENGINES)
        for name in ("max_tp", "dp", "tp", "pp", "micro_batch", "virtual_stages"):
            _positive(f"constraints.{name}", getattr(self, name))
        if self.zero_stage is not None and (isinstance(self.zero_stage, bool) or self.zero_stage not in (0, 1, 2, 3)):
            raise ValueError(f"constraints.zero_stage: expected 0, 1, 2 or 3, got {self.zero_stage!r}")
        _choice("constraints.recompute", self.recompute, RECOMPUTES, allow_none=True)
        _choice("constraints.offload_optimizer", self.offload_optimizer, OFFLOADS, allow_none=True)
        _choice("constraints.offload_params", self.offload_params, OFFLOADS, allow_none=True)
        _fraction("constraints.memory_headroom", self.memory_headroom, low=0.0, high=0.9)
        pinned_offload = [
            n for n in ("offload_optimizer", "offload_params") if getattr(self, n) not in (None, "none")
        ]
        if not self.offload and pinned_offload:
            raise ValueError(f"constraints.{pinned_offload[0]}: offload is pinned on but offload is false")
        if "nvme" in (self.offload_optimizer, self.offload_params) and not self.nvme_path:
            raise ValueError("constraints.nvme_path: NVMe offload needs nvme_path (a local NVMe directory)")
        if self.tp is not None and self.max_tp is not None and self.tp > self.max_tp:
            raise ValueError(f"constraints.tp: pinned tp={self.tp} exceeds max_tp={self.max_tp}")
        if self.engine == "megatron":
            if self.zero_stage is not None and self.zero_stage > 1:
                raise ValueError(
                    "constraints.zero_stage: the megatron engine shards optimizer states only "
                    "(distributed optimizer = ZeRO 1); use engine: deepspeed for ZeRO 2/3"
                )
            if pinned_offload:
                raise ValueError(f"constraints.{pinned_offload[0]}: ZeRO-Offload needs engine: deepspeed")
        if self.engine == "deepspeed" and self.virtual_stages is not None and self.virtual_stages > 1:
            raise ValueError(
                "constraints.virtual_stages: DeepSpeed's pipeline engine runs plain 1F1B; "
                "interleaving needs engine: megatron"
            )
        if self.pp is not None and self.pp > 1 and self.zero_stage is not None and self.zero_stage > 1:
            raise ValueError("constraints.zero_stage: DeepSpeed's pipeline engine takes ZeRO 0 or 1 only (pp > 1)")


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Intent:
    """The whole intent; sections are checked on their own, and here against each other."""

    model: ModelIntent
    cluster: ClusterIntent = dataclasses.field(default_factory=ClusterIntent)
    training: TrainingIntent = dataclasses.field(default_factory=TrainingIntent)
    constraints: Constraints = dataclasses.field(default_factory=Constraints)

    def __post_init__(self) -> None:
        world = self.cluster.world_size
        c = self.constraints
        pinned = {n: getattr(c, n) for n in ("dp", "tp", "pp") if getattr(c, n) is not None}
        product = 1
        for value in pinned.values():
            product *= value
        if pinned and world % product:
            names = " x ".join(f"{n}={v}" for n, v in pinned.items())
            divisors = ", ".join(str(d) for d in range(1, world + 1) if world % d == 0)
            raise ValueError(
                f"constraints.{next(iter(pinned))}: {names} does not divide the world size "
                f"{world} ({self.cluster.num_nodes} node(s) x {self.cluster.gpus_per_node} GPUs)"
                f" -- fix: pick degrees whose product divides {world}: {divisors}"
            )
        if len(pinned) == 3 and product != world:
            raise ValueError(f"constraints.dp: dp x tp x pp = {product} but the cluster has {world} GPUs")
        per_node = self.cluster.gpus_per_node
        if c.tp is not None and per_node % c.tp and not c.tp_across_nodes:
            fits = ", ".join(str(d) for d in range(1, per_node + 1) if per_node % d == 0)
            where = "is larger than a node" if c.tp > per_node else "does not divide the GPUs of a node"
            raise ValueError(
                f"constraints.tp: tp={c.tp} {where} ({per_node} GPUs), so a TP group would span two nodes"
                f" -- fix: pick a tp that divides {per_node} ({fits}), or allow it with tp_across_nodes: true (--tp-across-nodes)"
            )
        if c.micro_batch is not None and self.training.sequences_per_step % c.micro_batch:
            raise ValueError(
                f"constraints.micro_batch: {c.micro_batch} does not divide the global batch "
                f"{self.training.sequences_per_step}"
            )
        if c.dp is not None and self.training.sequences_per_step % c.dp:
            raise ValueError(
                f"constraints.dp: dp={c.dp} does not divide the global batch {self.training.sequences_per_step} sequences"
            )
        if self.cluster.gpu == "cpu" and self.training.precision == "fp16":
            raise ValueError("training.precision: DeepSpeed's CPU accelerator has no fp16; use bf16 or fp32")

    def to_dict(self) -> dict:
        return {
            section: _jsonable(dataclasses.asdict(getattr(self, section)))
            for section in ("model", "cluster", "training", "constraints")
        }


def _jsonable(data: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}


SECTIONS: dict[str, type] = {
    "model": ModelIntent,
    "cluster": ClusterIntent,
    "training": TrainingIntent,
    "constraints": Constraints,
}


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(sorted(choices))}"


def _coerce(where: str, value: Any, hint: Any) -> Any:
    """Check a YAML value against a field's annotation; ints are not bools, floats accept ints."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(where, value, option)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError(errors[0])
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ValueError(f"{where}: expected a list of {len(args)} numbers, got {value!r}")
        return tuple(_coerce(f"{where}[{i}]", v, a) for i, (v, a) in enumerate(zip(value, args)))
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, str):
            try:  # PyYAML reads "1e12" (no dot) as a string
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
                return int(value)  # YAML reads 1e12 as a float; an integral float is the number meant
            raise ValueError(f"{where}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, str):
            try:  # PyYAML reads "3e-4" (no dot) as a string
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported annotation {hint!r} for {where}")  # a programmer mistake


def _section(name: str, data: Any, *, source: str) -> Any:
    cls = SECTIONS[name]
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise DstkError(
            f"{name}: expected a mapping of keys, got {type(data).__name__}",
            hint=f"write `{name}:` followed by indented `key: value` lines",
            location=source,
        )
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    values = {}
    for key, value in data.items():
        if key not in known:
            raise DstkError(
                f"{name}.{key}: unknown key",
                hint=_did_you_mean(str(key), known),
                location=source,
            )
        try:
            values[key] = _coerce(f"{name}.{key}", value, hints[key])
        except ValueError as exc:
            raise DstkError(str(exc), hint=_field_help(cls, key), location=source) from None
    try:
        return cls(**values)
    except ValueError as exc:
        raise DstkError(_split_fix(exc)[0], hint=_hint_for(exc), location=source) from None


def _field_help(cls: type, key: str) -> str:
    doc = FIELD_DOCS.get((cls.__name__, key))
    return f"{key}: {doc}" if doc else f"see `dstk plan --help` for {key}"


def _split_fix(exc: ValueError) -> tuple[str, str | None]:
    """A check may end its message with `` -- fix: ...``; that part becomes the hint."""
    message, _, fix = str(exc).partition(" -- fix: ")
    return message, fix or None


def _hint_for(exc: ValueError) -> str:
    fix = _split_fix(exc)[1]
    if fix:
        return fix
    field = str(exc).split(":", 1)[0]
    section, _, key = field.partition(".")
    cls = SECTIONS.get(section)
    if cls is not None and key:
        return _field_help(cls, key.split("[")[0])
    return "fix the value named above"


def intent_from_dict(data: Any, *, source: str = "<intent>") -> Intent:
    """Build an ``Intent`` from parsed YAML; every error names the field and a fix."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise DstkError(
            f"an intent is a mapping with model/cluster/training/constraints, got {type(data).__name__}",
            hint="see examples/intents/ for the shape",
            location=source,
        )
    for key in data:
        if key not in SECTIONS:
            raise DstkError(f"{key}: unknown section", hint=_did_you_mean(str(key), SECTIONS), location=source)
    if "model" not in data:
        raise DstkError(
            "model: missing",
            hint="add `model: {name: llama-3-8b}` or the dimensions (num_layers, hidden_size, num_heads, vocab_size)",
            location=source,
        )
    sections = {name: _section(name, data.get(name), source=source) for name in SECTIONS}
    try:
        return Intent(**sections)
    except ValueError as exc:
        raise DstkError(_split_fix(exc)[0], hint=_hint_for(exc), location=source) from None


def load_intent(path: str | os.PathLike) -> Intent:
    """Read an intent YAML file."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise UsageError(f"cannot read the intent: {exc.strerror}", location=str(path), hint="check the path") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise DstkError(
            f"not valid YAML: {getattr(exc, 'problem', None) or exc}", hint="fix the YAML syntax", location=where
        ) from None
    return intent_from_dict(data, source=str(path))


def with_overrides(intent: Intent | None, overrides: dict[str, dict[str, Any]], *, source: str = "flags") -> Intent:
    """Apply flag values (``{"training": {"seq_len": 4096}}``) over an intent; flags win.

    Setting a model name drops the dimensions and vice versa, so ``--model`` replaces a
    dimension-mode model from the file instead of clashing with it."""
    base = intent.to_dict() if intent is not None else {}
    merged: dict[str, dict] = {name: dict(base.get(name, {})) for name in SECTIONS}
    for section, values in overrides.items():
        values = {k: v for k, v in values.items() if v is not None}
        if not values:
            continue
        if section == "model":
            if "name" in values:
                merged["model"] = {}
            elif any(k in values for k in REQUIRED_DIMS):
                merged["model"].pop("name", None)
        if section == "training" and "global_batch" in values:
            merged["training"].pop("global_batch_tokens", None)
        if section == "training" and "global_batch_tokens" in values:
            merged["training"].pop("global_batch", None)
        merged[section].update(values)
    if not merged["model"]:
        raise UsageError(
            "no model given",
            hint="pass an intent file, or --model NAME, or --num-layers/--hidden-size/--num-heads/--vocab-size",
        )
    return intent_from_dict(merged, source=source if intent is None else f"{source} over the intent file")


def _field_docs() -> dict[tuple[str, str], str]:
    """Field docstrings, read from this module's source: the one place help text lives."""
    import ast
    import inspect

    docs: dict[tuple[str, str], str] = {}
    try:
        tree = ast.parse(inspect.getsource(inspect.getmodule(_field_docs)))
    except (OSError, TypeError):
        return docs
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            body = node.body
            for a, b in zip(body, body[1:]):
                if (
                    isinstance(a, ast.AnnAssign)
                    and isinstance(a.target, ast.Name)
                    and isinstance(b, ast.Expr)
                    and isinstance(b.value, ast.Constant)
                    and isinstance(b.value.value, str)
                ):
                    docs[(node.name, a.target.id)] = " ".join(b.value.value.split())
    return docs


FIELD_DOCS = _field_docs()


def field_doc(section: str, key: str) -> str:
    """The help text of ``section.key`` (for argparse and error hints)."""
    return FIELD_DOCS.get((SECTIONS[section].__name__, key), "")
