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
import math
import os
import types
import typing
from typing import Any, Literal

from dstk.errors import DstkError, UsageError
from dstk.layout import ATTENTIONS, OFFLOADS, OPTIMIZERS, PRECISIONS, RECOMPUTES, Lora, Training

Schedule = Literal["cosine", "linear", "constant"]
Engine = Literal["deepspeed", "megatron"]
SCHEDULES: tuple[str, ...] = ("cosine", "linear", "constant")
ENGINES: tuple[str, ...] = ("deepspeed", "megatron")
# The dimensions a generic GPT-style decoder needs, when no preset or HF config names it.
REQUIRED_DIMS: tuple[str, ...] = ("num_layers", "hidden_size", "num_heads", "vocab_size")


MAX_NODES = 65_536
MAX_GPUS_PER_NODE = 1_024
MAX_GLOBAL_BATCH = 2**26
"""Sequences per step. The planner enumerates the divisors of the global batch and of the world
size, so these bound its work (`plan --global-batch 9223372036854775807` had not finished after 20 s);
each is far beyond published runs (Llama 3 405B: 16,384 GPUs, 16M-token batches of 8,192-token sequences
= 2,048 sequences; Dubey et al. 2024, "The Llama 3 Herd of Models", section 3.3)."""
MAX_GIB = 2.0**20
"""A GPU's or a host's memory: at most 1 PiB (more overflows the byte counts)."""
MAX_TFLOPS = 1e6
MAX_INTENT_BYTES = 1 << 20
"""An intent is a few hundred bytes; a larger file is not one (and /dev/zero would never end)."""
MAX_NESTING = 32
"""Mapping/list levels an intent may have (it needs 3: the document, a section, betas)."""
MAX_NUMBER_CHARS = 40
"""Digits a number may have in an intent or a flag (2**63 has 19)."""
MAX_INT = 2**63 - 1
"""The largest integer any intent field takes (the planner's own limits on counts come later)."""


def _positive(name: str, value, *, allow_none: bool = True, maximum: int | None = None) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}: {value} is more than dstk plans for (at most {maximum:,})")


def _choice(name: str, value, choices: tuple[str, ...], *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(choices)}, got {value!r}")


def _fraction(name: str, value, *, low: float, high: float, high_included: bool = False) -> None:
    if not (low <= value < high or high_included and value == high):
        raise ValueError(f"{name}: expected a number in [{low}, {high}{']' if high_included else ')'}, got {value!r}")


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
        _positive("cluster.num_nodes", self.num_nodes, allow_none=False, maximum=MAX_NODES)
        _positive("cluster.gpus_per_node", self.gpus_per_node, allow_none=False, maximum=MAX_GPUS_PER_NODE)
        if not isinstance(self.gpu, str) or not self.gpu:
            raise ValueError(f"cluster.gpu: expected a GPU slug such as h100-sxm, got {self.gpu!r}")
        for name, maximum in (("gpu_memory_gib", MAX_GIB), ("gpu_tflops", MAX_TFLOPS), ("host_memory_gib", MAX_GIB)):
            value = getattr(self, name)
            if value is not None and not 0 < value <= maximum:
                if value > maximum:
                    raise ValueError(f"cluster.{name}: {value:g} is more than dstk plans for (at most {maximum:,.0f})")
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
    attention: str | None = None
    """Attention kernel: sdpa, flash or eager (eager materialises the score matrix); default sdpa where
    the model's HF class has it, else eager (BLOOM)."""
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
    lora_rank: int | None = None
    """Train LoRA adapters of rank R on a frozen base (peft; e.g. 8); None: every parameter trains."""
    lora_alpha: float | None = None
    """LoRA scale numerator, update = A/R * BA (default 2R)."""
    lora_targets: str | None = None
    """Modules to adapt: all-linear (default), attention, mlp, or names such as q,v / gate,up,down / q_proj (the
    family's module names; a wrong one lists them)."""
    lora_dropout: float | None = None
    """Dropout on the LoRA adapters' input, in [0, 1) (default 0)."""
    lora_bits: int | None = None
    """4: QLoRA, NF4 base weights (bitsandbytes, CUDA only)."""

    def __post_init__(self) -> None:
        for name in ("seq_len", "global_batch", "global_batch_tokens", "num_tokens", "train_steps", "warmup_steps"):
            _positive(f"training.{name}", getattr(self, name))
        _choice("training.precision", self.precision, PRECISIONS, allow_none=True)
        _choice("training.optimizer", self.optimizer, OPTIMIZERS)
        _choice("training.attention", self.attention, ATTENTIONS, allow_none=True)
        _choice("training.schedule", self.schedule, SCHEDULES)
        if not self.lr > 0:
            raise ValueError(f"training.lr: expected a positive learning rate, got {self.lr!r}")
        _fraction("training.min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0, high_included=True)
        if self.weight_decay < 0:
            raise ValueError(f"training.weight_decay: expected >= 0, got {self.weight_decay!r}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"training.betas: expected two numbers in [0, 1), got {self.betas!r}")
        if not self.eps > 0:
            raise ValueError(f"training.eps: expected a positive number, got {self.eps!r}")
        if self.grad_clip < 0:
            raise ValueError(f"training.grad_clip: expected >= 0 (0 = off), got {self.grad_clip!r}")
        _positive("training.lora_rank", self.lora_rank)
        if self.lora_rank is None:
            given = [n for n in ("lora_alpha", "lora_targets", "lora_dropout", "lora_bits")
                     if getattr(self, n) is not None]
            if given:
                raise ValueError(f"training.{given[0]}: set without training.lora_rank -- fix: add lora_rank "
                                 "(--lora-rank R, e.g. 8) for LoRA, or drop it")
        if self.lora_alpha is not None and not self.lora_alpha > 0:
            raise ValueError(f"training.lora_alpha: expected > 0, got {self.lora_alpha!r}")
        if self.lora_dropout is not None:
            _fraction("training.lora_dropout", self.lora_dropout, low=0.0, high=1.0)
        if self.lora_bits not in (None, 4):
            raise ValueError(f"training.lora_bits: only 4 (QLoRA, NF4) is supported, got {self.lora_bits!r}")
        if self.global_batch is not None and self.global_batch_tokens is not None:
            raise ValueError("training.global_batch: give global_batch or global_batch_tokens, not both")
        if self.global_batch is not None and self.global_batch > MAX_GLOBAL_BATCH:
            raise ValueError(f"training.global_batch: {self.global_batch} sequences is more than dstk plans for "
                             f"(at most {MAX_GLOBAL_BATCH:,})")
        if self.global_batch_tokens is not None and self.global_batch_tokens // self.seq_len > MAX_GLOBAL_BATCH:
            raise ValueError(f"training.global_batch_tokens: {self.global_batch_tokens} tokens is more than "
                             f"{MAX_GLOBAL_BATCH:,} sequences of {self.seq_len}, more than dstk plans for")
        if self.global_batch_tokens is not None and self.global_batch_tokens % self.seq_len:
            near = sorted({max(1, self.global_batch_tokens // self.seq_len) * self.seq_len,
                           (self.global_batch_tokens // self.seq_len + 1) * self.seq_len})  # below seq_len: one
            raise ValueError(
                f"training.global_batch_tokens: {self.global_batch_tokens} is not a multiple of seq_len "
                f"{self.seq_len} -- fix: nearest: {' or '.join(map(str, near))}"
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
        bf16 here, an unresolved attention sdpa; ``dstk.plan.resolve`` sets them from the GPU and
        the model first)."""
        return Training(
            seq_len=self.seq_len,
            global_batch=self.sequences_per_step,
            precision=self.precision or "bf16",
            optimizer=self.optimizer,
            attention=self.attention or "sdpa",
            num_tokens=self.num_tokens,
            lora=self.lora,
            grad_clip=self.grad_clip,
        )

    @property
    def lora(self) -> Lora | None:
        """The LoRA settings with their defaults (alpha 2 x rank, all-linear, no dropout); None without lora_rank."""
        if self.lora_rank is None:
            return None
        alpha = self.lora_alpha if self.lora_alpha is not None else 2 * self.lora_rank
        return Lora(rank=self.lora_rank, alpha=float(alpha), targets=self.lora_targets or "all-linear",
                    dropout=float(self.lora_dropout or 0.0), bits=self.lora_bits)


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
                " -- fix: add --engine megatron (engine: megatron), or drop virtual_stages (--virtual-stages)"
            )
        if self.pp is not None and self.pp > 1 and self.zero_stage is not None and self.zero_stage > 1:
            raise ValueError("constraints.zero_stage: DeepSpeed's pipeline engine takes ZeRO 0 or 1 only (pp > 1)"
                             " -- fix: pin zero_stage 0 or 1 (--zero 1) with the pipeline, or drop the pp pin "
                             "(--pp) for ZeRO-2/3")


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
                f" -- fix: pin a micro-batch that divides {self.training.sequences_per_step} "
                f"({_divisors_text(self.training.sequences_per_step)}), or change the global batch"
            )
        if c.dp is not None and self.training.sequences_per_step % c.dp:
            raise ValueError(
                f"constraints.dp: dp={c.dp} does not divide the global batch {self.training.sequences_per_step} sequences"
                f" -- fix: make the global batch a multiple of {c.dp}, or pin a dp that divides "
                f"{self.training.sequences_per_step} ({_divisors_text(self.training.sequences_per_step)})"
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


def _divisors_text(n: int, *, most: int = 12) -> str:
    """``1, 2, 4, 8, 16`` (the first ``most`` divisors of ``n``, then ``...``), for a fix hint."""
    found = [d for d in range(1, min(n, 10**6) + 1) if n % d == 0]
    return ", ".join(str(d) for d in found[:most]) + (", ..." if len(found) > most else "")


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
        if isinstance(value, str) and len(value) <= MAX_NUMBER_CHARS:
            try:  # PyYAML reads "1e12" (no dot) as a string
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_INT:
                return int(value)  # YAML reads 1e12 as a float; an integral float is the number meant
            if isinstance(value, float) and math.isfinite(value) and value.is_integer():
                raise ValueError(f"{where}: {value:.4g} is too large (at most {MAX_INT:.4g})")
            raise ValueError(f"{where}: expected an integer, got {_short(value)}")
        if abs(value) > MAX_INT:
            raise ValueError(f"{where}: {_short(value)} is too large (at most {MAX_INT:.4g})")
        return value
    if hint is float:
        if isinstance(value, str) and len(value) <= MAX_NUMBER_CHARS:
            try:  # PyYAML reads "3e-4" (no dot) as a string
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: expected a number, got {_short(value)}")
        if isinstance(value, int) and abs(value) > MAX_INT:
            raise ValueError(f"{where}: {_short(value)} is too large (at most {MAX_INT:.4g})")
        if not math.isfinite(value):
            raise ValueError(f"{where}: expected a finite number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported annotation {hint!r} for {where}")  # a programmer mistake


def _short(value: Any) -> str:
    """``repr`` cut to 60 characters (a 5,000-digit number in an error is no help)."""
    if isinstance(value, int) and abs(value) >= 10**60:  # str() of a 5,000-digit int is a ValueError
        return f"a {int(abs(value).bit_length() * math.log10(2)) + 1}-digit number"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _numeric(hint: Any) -> bool:
    """Whether a field holds numbers (int, float, a tuple of them, optionally None)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_numeric(a) for a in args if a is not type(None))
    if typing.get_origin(hint) is tuple:
        return all(_numeric(a) for a in args)
    return hint in (int, float)


def _section(name: str, data: Any, *, source: str, marks: dict | None = None) -> Any:
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
    marks = marks or {}
    values = {}
    for key, value in data.items():
        where = _where(source, marks, f"{name}.{key}")
        if key not in known:
            raise DstkError(
                f"{name}.{key}: unknown key",
                hint=_did_you_mean(str(key), known),
                location=where,
            )
        if marks.get(f"{name}.{key}", (0, False))[1] and _numeric(hints[key]):
            raise DstkError(
                f"{name}.{key}: {_short(value)} is a quoted string, not a number",
                hint=f"write the number without quotes: `{key}: {value if isinstance(value, str) else '...'}`",
                location=where,
            )
        try:
            values[key] = _coerce(f"{name}.{key}", value, hints[key])
        except ValueError as exc:
            raise DstkError(str(exc), hint=_field_help(cls, key), location=where) from None
    try:
        return cls(**values)
    except ValueError as exc:
        raise DstkError(_split_fix(exc)[0], hint=_hint_for(exc), location=_where(source, marks, str(exc))) from None


def _where(source: str, marks: dict, field: str) -> str:
    """``file:line`` of ``section.key`` (or of the field an error message starts with) when known."""
    field = field.split(":", 1)[0].split("[")[0].strip()
    line = marks.get(field, (None,))[0] or marks.get(field.split(".")[0], (None,))[0]
    return f"{source}:{line}" if line else source


def _field_help(cls: type, key: str) -> str:
    """The fix line of a refused value: what the field is and, where it has one, that leaving it
    out gives the default (the line was the field's description alone: "fix: lr: Peak learning rate.")."""
    doc = FIELD_DOCS.get((cls.__name__, key))
    field = next((f for f in dataclasses.fields(cls) if f.name == key), None)
    default = field.default if field is not None else dataclasses.MISSING
    keep = ("" if default is dataclasses.MISSING or default is None
            else f"; give a value the message above allows, or leave it out for the default {default!r}")
    return (f"{key}: {doc.rstrip('.')}{keep}" if doc else f"see `dstk plan --help` for {key}{keep}")


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


def intent_from_dict(data: Any, *, source: str = "<intent>", marks: dict | None = None) -> Intent:
    """Build an ``Intent`` from parsed YAML; every error names the field and a fix. ``marks`` (from
    ``parse_intent_text``) maps ``section.key`` to ``(line, quoted)``, for ``file:line`` in errors and to
    refuse a quoted number."""
    marks = marks or {}
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
            raise DstkError(f"{key}: unknown section", hint=_did_you_mean(str(key), SECTIONS),
                            location=_where(source, marks, str(key)))
    if "model" not in data:
        raise DstkError(
            "model: missing",
            hint="add `model: {name: llama-3-8b}` or the dimensions (num_layers, hidden_size, num_heads, vocab_size)",
            location=source,
        )
    sections = {name: _section(name, data.get(name), source=source, marks=marks) for name in SECTIONS}
    try:
        return Intent(**sections)
    except ValueError as exc:
        raise DstkError(_split_fix(exc)[0], hint=_hint_for(exc), location=_where(source, marks, str(exc))) from None


def read_intent_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of an intent file: a regular file or a pipe of at most ``MAX_INTENT_BYTES``; a
    directory, a device (``/dev/zero``) or a larger file is refused with the path and a fix."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise UsageError(f"cannot read the intent: {exc.strerror}", location=str(path), hint="check the path") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise UsageError("the intent is a directory, not a YAML file", location=str(path),
                             hint="give the intent YAML file inside it (see examples/intents/)")
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            raise UsageError("the intent is a device or socket, not a YAML file", location=str(path),
                             hint="give an intent YAML file (see examples/intents/), or - for standard input")
        chunks, size = [], 0
        while size <= MAX_INTENT_BYTES and (chunk := os.read(fd, MAX_INTENT_BYTES + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise UsageError(f"cannot read the intent: {exc.strerror}", location=str(path), hint="check the path") from None
    finally:
        os.close(fd)
    if len(data) > MAX_INTENT_BYTES:
        raise DstkError(f"the intent is larger than {MAX_INTENT_BYTES >> 20} MiB; an intent is a few lines of YAML",
                        location=str(path), hint="give the intent YAML file (see examples/intents/)")
    return data


def parse_intent_text(raw: bytes | str, *, source: str, what: str = "intent",
                      example: str = "an intent YAML file (see examples/intents/)") -> tuple[Any, dict]:
    """Parse an intent's YAML (JSON is YAML too) strictly: the data and ``marks`` (``section.key`` ->
    ``(line, quoted)``). Refused with ``file:line`` and a fix: binary or non-UTF-8 bytes, YAML
    errors, more than ``MAX_NESTING`` levels (PyYAML's composer recurses, so 10,000 levels would be a
    RecursionError), aliases (``&a [*a]`` is a cycle; nine aliases over nine levels, "billion laughs",
    are 9**9 values), numbers of more than ``MAX_NUMBER_CHARS`` characters (Python refuses to read an
    int of more than 4,300 digits) and duplicate keys (PyYAML keeps the last one silently).
    ``what``/``example`` name the file in messages when it is not an intent (``parse_user_text``)."""
    import yaml

    text = _user_text(raw, source=source, what=what, example=example)

    def fail(message: str, mark, hint: str) -> DstkError:
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        return DstkError(message, hint=hint, location=where)

    resolver = yaml.resolver.Resolver()  # the plain-scalar tags of SafeLoader
    try:
        depth = 0
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_NESTING:
                    raise fail(f"nested more than {MAX_NESTING} levels deep"
                               + ("; an intent has 2 (section: key: value)" if what == "intent" else ""),
                               event.start_mark, f"compare with {example}")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
            elif isinstance(event, yaml.AliasEvent):  # `*a` nine times over nine levels: 9**9 values
                raise fail(f"a YAML alias (*{event.anchor}): {what}s are read without aliases (a cyclic or "
                           "exponentially expanding one would hang dstk)",
                           event.start_mark, "write the value out where the alias is")
            elif isinstance(event, yaml.ScalarEvent) and len(event.value) > MAX_NUMBER_CHARS and event.style is None \
                    and resolver.resolve(yaml.ScalarNode, event.value, (True, False)) in _NUMBER_TAGS:
                raise fail(f"a {len(event.value)}-character number; no {what} field takes one that large",
                           event.start_mark, "give a realistic value (counts are at most 2**63)")
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            marks: dict[str, tuple[int, bool]] = {}
            _check_keys(node, prefix="", marks=marks, fail=fail)
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise fail(f"not valid YAML: {getattr(exc, 'problem', None) or exc}", mark, "fix the YAML syntax") from None
    return data, marks


_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
"""What PyYAML's resolver makes of a plain scalar that is a number (decimal, 0x, 0o, 0b, 1:30 base 60)."""


def _check_keys(node, *, prefix: str, marks: dict, fail) -> None:
    """Walk the composed YAML: refuse a key given twice (also in a JSON intent), and note where each
    ``section.key`` is and whether its value was quoted."""
    import yaml

    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _check_keys(item, prefix=prefix, marks=marks, fail=fail)
        return
    if not isinstance(node, yaml.MappingNode):
        return
    seen: dict[str, int] = {}
    for key_node, value_node in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
        if key in seen:
            name = f"{prefix}{key}"
            raise fail(f"{name}: given twice (first on line {seen[key]}); the YAML/JSON reader would keep the last "
                       "one silently",
                       key_node.start_mark, f"keep one `{key}:` line")
        seen[key] = key_node.start_mark.line + 1
        quoted = isinstance(value_node, yaml.ScalarNode) and value_node.style in ("'", '"') or (
            isinstance(value_node, yaml.SequenceNode)
            and any(isinstance(v, yaml.ScalarNode) and v.style in ("'", '"') for v in value_node.value))
        marks.setdefault(f"{prefix}{key}", (key_node.start_mark.line + 1, quoted))
        _check_keys(value_node, prefix=f"{prefix}{key}.", marks=marks, fail=fail)


def _user_text(raw: bytes | str, *, source: str, what: str, example: str) -> str:
    """The text of a user's file; NUL bytes and non-UTF-8 are refused with ``file:line``."""
    if not isinstance(raw, bytes):
        return raw
    if b"\x00" in raw:
        line = raw[: raw.index(b"\x00")].count(b"\n") + 1
        raise DstkError(f"the {what} is a binary file (it holds NUL bytes), not YAML", location=f"{source}:{line}",
                        hint=f"give {example}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DstkError(f"the {what} is not UTF-8 text (byte 0x{raw[exc.start]:02x})", location=f"{source}:{line}",
                        hint="save the file as UTF-8" + (" (an intent needs only ASCII)" if what == "intent" else "")
                        ) from None


def parse_user_text(raw: bytes | str, *, source: str, what: str, example: str) -> tuple[Any, dict[str, int]]:
    """A user's YAML or JSON file other than the intent (``--hardware``, ``--from``, ``--training-args``),
    read as strictly as an intent: the data and ``{"dotted.key": line}``. Each format gets its own
    reader's values, as the tool that wrote or reads the file would:

    - JSON (the text starts with ``{`` or ``[``) by ``json``, as transformers, accelerate and dstk
      read it (to PyYAML's YAML 1.1, ``1e-05`` is a string, and tabs or surrogate pairs, both valid
      JSON, are errors). Refused with ``file:line``: syntax errors, duplicate keys (``json`` keeps the
      last silently; located with the validator's scanner, ``dstk.validate.source.locate``), ``NaN`` /
      ``Infinity`` (not JSON), integers past Python's 4,300 digits, nesting past ``MAX_NESTING``.
    - YAML by ``parse_intent_text`` (duplicate keys, aliases, deep nesting, huge numbers, NUL/non-UTF-8).
      Quoted numbers are left to the caller: unlike an intent's fields, these files' values are the
      other tool's to type.
    """
    import json

    text = _user_text(raw, source=source, what=what, example=example)
    if not text.lstrip().startswith(("{", "[")):
        data, marks = parse_intent_text(text, source=source, what=what, example=example)
        return data, {key: line for key, (line, _quoted) in marks.items()}
    from dstk.validate.source import locate

    duplicates: list[str] = []

    def pairs(items: list) -> dict:
        out: dict = {}
        for key, value in items:
            if key in out:
                duplicates.append(key)
            out[key] = value
        return out

    def constant(name: str):
        raise ValueError(f"{name} is not a JSON number")

    try:
        data = json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise DstkError(f"not valid JSON: {exc.msg}", location=f"{source}:{exc.lineno}:{exc.colno}",
                        hint="fix the JSON syntax") from None
    except RecursionError:
        data = None
        duplicates = ["<nesting>"]
    except ValueError as exc:  # NaN/Infinity, or an integer of more than 4,300 digits
        raise DstkError(f"{exc}; no {what} field takes it", location=source,
                        hint="write a finite number of realistic size") from None
    positions, located = locate(text)
    lines = {pointer.strip("/").replace("/", "."): pos[0] for pointer, pos in positions.items() if pointer}
    depth, level = 0, [(data, 1)]
    while level and data is not None:
        node, d = level.pop()
        depth = max(depth, d)
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        level.extend((child, d + 1) for child in children if isinstance(child, (dict, list)))
    if depth > MAX_NESTING or duplicates == ["<nesting>"]:
        raise DstkError(f"nested more than {MAX_NESTING} levels deep", location=source, hint=f"compare with {example}")
    if duplicates:
        pointer, (line, column) = located[0] if located else ("/" + duplicates[0], (None, None))
        name = pointer.strip("/").replace("/", ".")
        first = lines.get(name)
        raise DstkError(f"{name}: given twice" + (f" (first on line {first})" if first and first != line else "")
                        + "; the JSON reader would keep the last one silently",
                        location=f"{source}:{line}:{column}" if line else source,
                        hint=f"keep one \"{pointer.rsplit('/', 1)[-1]}\" key")
    return data, lines


def intent_from_text(raw: bytes | str, *, source: str) -> Intent:
    """An ``Intent`` from YAML text or bytes (``parse_intent_text``); an empty document is refused."""
    data, marks = parse_intent_text(raw, source=source)
    if data is None:
        raise DstkError("the intent is empty", location=source,
                        hint="write model/cluster/training sections (see examples/intents/)")
    return intent_from_dict(data, source=source, marks=marks)


def load_intent(path: str | os.PathLike) -> Intent:
    """Read an intent YAML (or JSON) file, strictly (``read_intent_bytes``, ``parse_intent_text``)."""
    return intent_from_text(read_intent_bytes(path), source=str(path))


def with_overrides(intent: Intent | None, overrides: dict[str, dict[str, Any]], *, source: str = "flags",
                   flags: dict[str, str] | None = None) -> Intent:
    """Apply flag values (``{"training": {"seq_len": 4096}}``) over an intent; flags win.

    Setting a model name drops the dimensions and vice versa, so ``--model`` replaces a
    dimension-mode model from the file instead of clashing with it. ``flags`` maps
    ``section.field`` to the flag that set it (``--seq-len``): an error about that field then
    names the flag and its value."""
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
    try:
        return intent_from_dict(merged, source=source if intent is None else f"{source} over the intent file")
    except DstkError as exc:
        field = exc.message.split(":", 1)[0]
        if flags and field in flags:
            section, _, key = field.partition(".")
            value = overrides.get(section, {}).get(key)
            shown = " ".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
            raise DstkError(f"{flags[field]} {_short(shown) if len(shown) > 60 else shown}: "
                            f"{exc.message.split(':', 1)[1].strip()} ({field})", hint=exc.hint) from None
        raise


def flag_number(flag: str, kind: type) -> typing.Callable[[str], int | float]:
    """An argparse ``type`` for a numeric flag that refuses, naming the flag with a fix (a
    ``DstkError``, exit 1, where argparse would exit 2 with "invalid int value" or, for ``inf``,
    ``nan`` and 5,000-digit numbers, pass them on): text that is not a number, non-finite values,
    more than ``MAX_NUMBER_CHARS`` characters, and for ``int`` a fraction or more than ``MAX_INT``.
    ``1e12`` is read as an integer where it is one. Ranges (positive, at most 1) are the intent's."""

    def parse(text: str) -> int | float:
        word = text.strip().replace("_", "")
        what = "an integer" if kind is int else "a number"
        example = f"give {what}, e.g. {flag} 8" if kind is int else f"give a finite {what[2:]} (see --help for {flag})"
        if len(word) > MAX_NUMBER_CHARS:
            raise DstkError(f"{flag}: a {len(word)}-character value; expected {what} of at most "
                            f"{MAX_NUMBER_CHARS} characters", hint=example)
        try:
            value: int | float = int(word) if kind is int and word.lstrip("+-").isdigit() else float(word)
        except ValueError:
            raise DstkError(f"{flag} {text!r}: expected {what}", hint=example) from None
        if isinstance(value, float) and not math.isfinite(value):
            raise DstkError(f"{flag} {text}: expected a finite number", hint=example)
        if kind is int:
            if isinstance(value, float):
                if not value.is_integer():
                    raise DstkError(f"{flag} {text}: expected a whole number", hint=example)
                if abs(value) > MAX_INT:
                    raise DstkError(f"{flag} {text}: too large (at most {MAX_INT:.4g})", hint=example)
                value = int(value)
            if abs(value) > MAX_INT:
                raise DstkError(f"{flag} {text}: too large (at most {MAX_INT:.4g})", hint=example)
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


FLAG_RANGES: dict[str, float] = {
    "params": 1e16, "tokens": 1e18, "num_layers": MAX_INT, "hidden_size": MAX_INT, "num_heads": MAX_INT,
    "vocab_size": MAX_INT, "ffn_hidden_size": MAX_INT, "num_kv_heads": MAX_INT,
    "gpus": MAX_NODES * MAX_GPUS_PER_NODE, "gpus_per_node": MAX_GPUS_PER_NODE, "gpu_memory_gib": MAX_GIB,
    "gpu_tflops": MAX_TFLOPS, "tp": MAX_GPUS_PER_NODE * MAX_NODES, "pp": MAX_GPUS_PER_NODE * MAX_NODES,
    "virtual_stages": MAX_INT, "micro_batch": MAX_GLOBAL_BATCH, "global_batch": MAX_GLOBAL_BATCH, "seq_len": MAX_INT,
}
"""Flags of ``dstk estimate`` (by argparse dest) that take a positive number, and their largest value."""


def check_flag_ranges(args) -> None:
    """Refuse, naming the flag (exit 1), a given ``FLAG_RANGES`` flag that is zero, negative or
    larger than its maximum: never replace it by a default (``--seq-len 0`` used to become the
    model's length) and never let it reach the arithmetic (``--micro-batch 0``: a ZeroDivisionError)."""
    for dest, maximum in FLAG_RANGES.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        flag = "--" + dest.replace("_", "-")
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        if not value > 0:
            raise DstkError(f"{flag} {shown}: expected a positive number",
                            hint=f"give a positive {flag}, or leave it out")
        if value > maximum:
            raise DstkError(f"{flag} {shown}: more than dstk estimates for (at most {maximum:,.0f})",
                            hint=f"give a realistic {flag}")


def harden_numeric_flags(parser) -> None:
    """Give every ``type=int``/``type=float`` option of ``parser`` the checks of ``flag_number``."""
    for action in parser._actions:
        if action.type in (int, float) and action.option_strings:
            flag = max(action.option_strings, key=len)
            action.type = flag_number(flag, action.type)
            if action.choices is not None:  # --zero 5: the same exit 1 naming the flag as --zero abc
                action.type = _one_of(flag, action.type, tuple(action.choices))
                action.metavar = action.metavar or "{" + ",".join(str(c) for c in action.choices) + "}"
                action.choices = None


def _one_of(flag: str, parse, choices: tuple) -> typing.Callable[[str], int | float]:
    def checked(text: str) -> int | float:
        value = parse(text)
        if value not in choices:
            listed = ", ".join(str(c) for c in choices)
            raise DstkError(f"{flag} {text}: expected one of {listed}", hint=f"e.g. {flag} {choices[-1]}")
        return value

    checked.__name__ = parse.__name__
    return checked


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
