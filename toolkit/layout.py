"""The shared vocabulary of dstk: a parallel ``Layout`` and the ``Training`` settings it runs.

The estimator, the planner, the renderers and the launcher all speak these types; only the
renderers know DeepSpeed's or Megatron's key names. Pure data, no heavy imports.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Precision = Literal["bf16", "fp16", "fp32"]
Offload = Literal["none", "cpu", "nvme"]
Recompute = Literal["none", "selective", "full"]
Optimizer = Literal["adamw", "adam", "sgd", "lion", "adafactor"]
Attention = Literal["sdpa", "eager", "flash"]

PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp32")
OFFLOADS: tuple[str, ...] = ("none", "cpu", "nvme")
RECOMPUTES: tuple[str, ...] = ("none", "selective", "full")
OPTIMIZERS: tuple[str, ...] = ("adamw", "adam", "sgd", "lion", "adafactor")
ATTENTIONS: tuple[str, ...] = ("sdpa", "eager", "flash")


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(choices)}, got {value!r}")


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Layout:
    """One way to spread a training job over ``dp * tp * pp`` ranks."""

    dp: int = 1
    """Data-parallel degree (replicas, or ZeRO shards)."""
    tp: int = 1
    """Tensor-parallel degree (Megatron TP or DeepSpeed AutoTP), normally inside one node."""
    pp: int = 1
    """Pipeline-parallel stages."""
    zero_stage: int = 0
    """ZeRO stage 0-3 over the data-parallel group. DeepSpeed's pipeline engine allows 0 or 1."""
    offload_optimizer: Offload = "none"
    """Where optimizer states live: on the GPU ("none"), in CPU memory or on NVMe (ZeRO >= 1)."""
    offload_params: Offload = "none"
    """Where parameters live between uses (ZeRO-3 only)."""
    micro_batch: int = 1
    """Sequences per micro-batch per data-parallel rank."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (the pipeline's micro-batch count when pp > 1)."""
    recompute: Recompute = "none"
    """Activation recomputation: none, selective (attention only) or full (every layer)."""
    virtual_stages: int = 1
    """Interleaved pipeline chunks per rank (Megatron's virtual pipeline); 1 = plain 1F1B."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism over the TP group (needs tp > 1)."""
    first_stage_layers: int | None = None
    """Decoder layers on the first pipeline stage (Megatron's ``--decoder-first-pipeline-num-layers``);
    None: the first stage takes its share of an even split. A multiple of ``virtual_stages``."""
    last_stage_layers: int | None = None
    """Decoder layers on the last pipeline stage (``--decoder-last-pipeline-num-layers``); None: an
    even share. The stages between take the rest evenly (``stage_layer_counts``)."""

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "micro_batch", "grad_accum", "virtual_stages"):
            _positive(name, getattr(self, name))
        for name in ("first_stage_layers", "last_stage_layers"):
            value = getattr(self, name)
            if value is None:
                continue
            _positive(name, value)
            if self.pp == 1:
                raise ValueError(f"{name}: uneven pipeline stages need pp > 1")
            if value % self.virtual_stages:
                raise ValueError(f"{name}: {value} layers do not split into {self.virtual_stages} "
                                 "interleaved chunks (Megatron needs a multiple of virtual_stages)")
        if self.zero_stage not in (0, 1, 2, 3) or isinstance(self.zero_stage, bool):
            raise ValueError(f"zero_stage: expected 0, 1, 2 or 3, got {self.zero_stage!r}")
        _choice("offload_optimizer", self.offload_optimizer, OFFLOADS)
        _choice("offload_params", self.offload_params, OFFLOADS)
        _choice("recompute", self.recompute, RECOMPUTES)
        if self.offload_optimizer != "none" and self.zero_stage == 0:
            raise ValueError("offload_optimizer: needs ZeRO stage 1, 2 or 3")
        if self.offload_params != "none" and self.zero_stage != 3:
            raise ValueError("offload_params: needs ZeRO stage 3")
        if self.pp > 1 and self.zero_stage > 1:
            raise ValueError("zero_stage: DeepSpeed's pipeline engine supports ZeRO 0 or 1 only (pp > 1)")
        if self.virtual_stages > 1 and self.pp == 1:
            raise ValueError("virtual_stages: interleaving needs pp > 1")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel: needs tp > 1")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def uneven_stages(self) -> bool:
        """True when the first or the last stage has its own layer count."""
        return self.first_stage_layers is not None or self.last_stage_layers is not None

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Decoder layers per pipeline stage for a model of ``num_layers`` (``stage_layer_counts``)."""
        return stage_layer_counts(num_layers=num_layers, pp=self.pp, virtual_stages=self.virtual_stages,
                                  first=self.first_stage_layers, last=self.last_stage_layers)

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: micro_batch * grad_accum * dp."""
        return self.micro_batch * self.grad_accum * self.dp

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Layout":
        return cls(**data)


def megatron_stage_layers(*, num_layers: int, pp: int) -> tuple[int, ...]:
    """Decoder layers per stage that dstk writes for Megatron-LM when the layout names no uneven
    stages: even when ``num_layers`` divides by ``pp`` (no arguments: megatron-core 0.16.1's
    ``get_num_layers_to_build`` asserts it divides), else ``--decoder-first/last-pipeline-num-layers``
    with the middle stages even (the only uneven split those arguments express) and the remainder
    kept off the ends, which also hold the embedding and the output layer.

    >>> megatron_stage_layers(num_layers=32, pp=4), megatron_stage_layers(num_layers=30, pp=4)
    ((8, 8, 8, 8), (7, 8, 8, 7))
    """
    if pp < 1 or num_layers < pp:
        raise ValueError(f"num_stages: cannot put {num_layers} layers on {pp} stages")
    if num_layers % pp == 0:
        return (num_layers // pp,) * pp
    if pp == 2:
        return (num_layers // 2, num_layers - num_layers // 2)
    middle = -(-num_layers // pp)  # ceil
    while True:
        ends = num_layers - middle * (pp - 2)
        if ends >= 2:
            first = ends // 2
            return (first,) + (middle,) * (pp - 2) + (ends - first,)
        middle -= 1


def stage_layer_counts(*, num_layers: int, pp: int, virtual_stages: int = 1, first: int | None = None,
                       last: int | None = None) -> tuple[int, ...]:
    """Decoder layers per pipeline stage.

    With ``first``/``last`` given, the rule of megatron-core 0.16.1 (``TransformerConfig.__post_init__``,
    "Uneven PP", and ``transformer_block.get_num_layers_to_build``): those stages take that many
    layers, the stages between split the rest evenly, and with interleaving every stage's count is a
    multiple of ``virtual_stages``. Without them an even split, the remainder on the first stages
    (what the estimator assumes for DeepSpeed's pipeline engine, whose partitioner balances
    parameters itself). A split Megatron cannot build is a ``ValueError``.
    """
    _positive("num_layers", num_layers)
    _positive("pp", pp)
    if first is None and last is None:
        if num_layers < pp:
            raise ValueError(f"pp: cannot put {num_layers} layers on {pp} stages")
        base, extra = divmod(num_layers, pp)
        return tuple(base + (1 if i < extra else 0) for i in range(pp))
    if pp == 1:
        raise ValueError("first_stage_layers: uneven pipeline stages need pp > 1")
    ends = [n for n in (first, last) if n is not None]
    for n in ends:
        _positive("first_stage_layers", n)
        if n % virtual_stages:
            raise ValueError(f"virtual_stages: an end stage of {n} layers does not split into {virtual_stages} chunks")
    rest, middle = num_layers - sum(ends), pp - len(ends)
    if (middle == 0) != (rest == 0) or rest < 0 or (middle and rest % middle):
        raise ValueError(f"first_stage_layers: {num_layers} layers less first={first}, last={last} leave {rest} "
                         f"for {middle} middle stage(s); they must split evenly (at least one layer each)")
    each = rest // middle if middle else 0
    if middle and each % virtual_stages:
        raise ValueError(f"virtual_stages: {each} layers per middle stage do not split into {virtual_stages} chunks")
    counts = [each] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return tuple(counts)


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Lora:
    """LoRA adapters on a frozen base (Hu et al. 2021), as the estimator and ``dstk finetune`` see them."""

    rank: int
    """``r``: the inner width of the adapters ``B A``."""
    alpha: float
    """Scale numerator: the update is ``(alpha / rank) * B A x``."""
    targets: str = "all-linear"
    """Modules to adapt, as ``--lora-targets`` names them (``dstk.train.lora.resolve_targets``)."""
    dropout: float = 0.0
    """Dropout on the adapters' input."""
    bits: int | None = None
    """4: QLoRA (NF4 base weights); None: the base in the compute precision."""

    def __post_init__(self) -> None:
        _positive("lora.rank", self.rank)
        if not self.alpha > 0:
            raise ValueError(f"lora.alpha: expected > 0, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout: expected a value in [0, 1), got {self.dropout!r}")
        if self.bits not in (None, 4):
            raise ValueError(f"lora.bits: expected None or 4, got {self.bits!r}")


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Training:
    """What one training step processes and with what numerics."""

    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step, over all data-parallel ranks."""
    precision: Precision = "bf16"
    """Compute precision; bf16/fp16 keep fp32 master weights and optimizer states."""
    optimizer: Optimizer = "adamw"
    """Optimizer family; decides the bytes of optimizer state per parameter."""
    attention: Attention = "sdpa"
    """Attention kernel: eager materialises the score matrix, sdpa/flash do not."""
    num_tokens: int | None = None
    """Token budget of the whole run, for a time-to-train figure; None when unknown."""
    lora: Lora | None = None
    """LoRA adapters on a frozen base; None: every parameter trains."""
    grad_clip: float = 1.0
    """Gradient clipping norm (DeepSpeed's ``gradient_clipping``; 0 = off). Under optimizer offload
    it decides whether ZeRO-1/2 rescale the CPU gradient (``dstk.hardware.host_unscale_runs``)."""

    def __post_init__(self) -> None:
        _positive("seq_len", self.seq_len)
        _positive("global_batch", self.global_batch)
        _choice("precision", self.precision, PRECISIONS)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("attention", self.attention, ATTENTIONS)
        if not isinstance(self.grad_clip, (int, float)) or isinstance(self.grad_clip, bool) or not self.grad_clip >= 0:
            raise ValueError(f"grad_clip: expected a number >= 0 (0 = off), got {self.grad_clip!r}")
        if self.num_tokens is not None:
            _positive("num_tokens", self.num_tokens)

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        if data["lora"] is None:  # a full fine-tune's plan.json is as it was
            del data["lora"]
        return data
