"""LoRA (and QLoRA) settings for ``dstk finetune``: which modules get adapters, checked before any
process starts, and the torch side that wraps a model with ``peft``.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"): a frozen linear
``W`` (fan_in -> fan_out) gets ``W x + (alpha / r) * B A x`` with ``A: r x fan_in`` (random) and
``B: fan_out x r`` (zeros, so training starts from the base model). Only ``A`` and ``B`` train.
QLoRA (Dettmers et al. 2023) keeps ``W`` in 4-bit NF4 through bitsandbytes' CUDA kernels.

Target names are per family and come from the family's ``MODULES`` (``dstk.models.<family>``):
each linear module of a layer is accepted by its role (``q, k, v, o`` or ``qkv, o`` for a fused
projection; ``gate, up, down`` or ``up, down``), its HF leaf name (``q_proj``, ``c_attn``,
``query_key_value``), that name without ``_proj`` (``gate_up``), or its path inside the layer
(``self_attn.q_proj``); ``attention``, ``mlp`` and ``all-linear`` name groups. peft gets the
paths inside the layer, which it matches as suffixes of the full module names.

No torch at import: the parent checks the flags and ``lora_size`` counts adapter parameters.
"""

from __future__ import annotations

import dataclasses

from dstk.errors import DstkError, UsageError

GROUPS = ("all-linear", "attention", "mlp")


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class LoraSettings:
    """The adapters of a LoRA run, as the ranks apply them (``TrainSpec.lora``)."""

    rank: int
    """``r``: the inner width of ``B A``."""
    alpha: float
    """Scale numerator: the update is ``(alpha / rank) * B A x``."""
    dropout: float = 0.0
    """Dropout on the adapter's input (peft's ``lora_dropout``), in [0, 1)."""
    targets: tuple[str, ...]
    """Module paths inside one layer (``self_attn.q_proj``, ...), resolved from the flags."""
    bits: int | None = None
    """4: QLoRA (NF4 base weights through bitsandbytes); None: base weights in the run's precision."""
    fan_in_fan_out: bool = False
    """True for GPT-2's ``Conv1D`` layers, whose weight is stored ``fan_in x fan_out``."""

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"rank: expected an integer >= 1, got {self.rank!r}")
        if not self.alpha > 0:
            raise ValueError(f"alpha: expected > 0, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout: expected a value in [0, 1), got {self.dropout!r}")
        if not self.targets:
            raise ValueError("targets: expected at least one module")
        if self.bits not in (None, 4):
            raise ValueError(f"bits: expected None or 4, got {self.bits!r}")

    @classmethod
    def from_json(cls, data: dict) -> "LoraSettings":
        return cls(**{**data, "targets": tuple(data["targets"])})


def _family_modules(family: str) -> dict:
    from dstk.models import family_module

    return family_module("llama" if family == "generic" else family).MODULES


def _linears(paths: tuple[str, ...] | str) -> tuple[str, ...]:
    paths = (paths,) if isinstance(paths, str) else tuple(paths)
    return tuple(p for p in paths if "norm" not in p.rsplit(".", 1)[-1])


def lora_modules(family: str) -> dict[str, tuple[str, ...]]:
    """``{"attention": paths, "mlp": paths}``: the linear modules of one layer that LoRA can adapt.

    Norms listed with the attention (Qwen3's ``q_norm``/``k_norm``) are not linear. An MoE
    family's MLP (Mixtral: a router and experts stored as 3-D parameters in transformers 5, not
    ``nn.Linear`` modules) is left out: peft's LoRA layers wrap linear modules."""
    modules = _family_modules(family)
    mlp = _linears(modules["mlp"])
    if any(".experts." in p for p in mlp):
        mlp = ()
    return {"attention": _linears(modules["attention"]), "mlp": mlp}


def target_names(family: str) -> dict[str, tuple[str, ...]]:
    """Every name ``--lora-targets`` accepts for ``family`` -> the module paths it stands for."""
    groups = lora_modules(family)
    roles = {4: ("q", "k", "v", "o"), 2: ("qkv", "o")}
    mlp_roles = {3: ("gate", "up", "down"), 2: ("up", "down")}
    names: dict[str, tuple[str, ...]] = {}

    def add(name: str, path: str) -> None:
        if path not in names.get(name, ()):
            names[name] = names.get(name, ()) + (path,)

    for kind, table in (("attention", roles), ("mlp", mlp_roles)):
        paths = groups[kind]
        for role, path in zip(table.get(len(paths), ()), paths):
            add(role, path)
        for path in paths:
            leaf = path.rsplit(".", 1)[-1]
            add(path, path)
            add(leaf, path)
            if leaf.endswith("_proj") and not leaf.startswith("c_"):  # GPT-2's c_proj is no "c"
                add(leaf.removesuffix("_proj"), path)
    names["attention"] = groups["attention"]
    if groups["mlp"]:
        names["mlp"] = groups["mlp"]
    names["all-linear"] = groups["attention"] + groups["mlp"]
    return names


def resolve_targets(*, family: str, targets: str | None) -> tuple[str, ...]:
    """Module paths for ``--lora-targets`` (comma-separated names; None or ``all-linear``: every
    linear module of the layers, not the lm_head, as peft's ``all-linear``). Unknown names are
    refused with the family's names listed."""
    names = target_names(family)
    wanted = [t.strip() for t in (targets or "all-linear").split(",") if t.strip()]
    if not wanted:
        raise UsageError("--lora-targets is empty", hint="e.g. --lora-targets q,v or all-linear")
    unknown = [t for t in wanted if t not in names]
    if unknown:
        listed = ", ".join(n for n in names if "." not in n)
        moe = ""
        if not lora_modules(family)["mlp"]:
            moe = f" ({family}'s MoE experts are not linear modules: LoRA adapts its attention only)"
        raise UsageError(f"--lora-targets {','.join(unknown)}: not a module of a {family} layer{moe}",
                         hint=f"choose from {listed}, or a path such as {names['all-linear'][0]}")
    out: list[str] = []
    for t in wanted:
        out += [p for p in names[t] if p not in out]
    return tuple(out)


def settings_from_flags(*, family: str, rank: int | None, alpha: float | None, dropout: float | None,
                        targets: str | None, bits: int | None) -> LoraSettings | None:
    """The flags of ``dstk finetune`` checked into settings (None without ``--lora-rank``).

    ``alpha`` defaults to ``2 * rank`` (torchtune's and many published recipes' choice, r=8 with
    alpha=16); ``dropout`` to 0 (peft's default)."""
    if rank is None:
        given = [f for f, v in (("--lora-alpha", alpha), ("--lora-dropout", dropout), ("--lora-targets", targets),
                                ("--lora-bits", bits)) if v is not None]
        if given:
            raise UsageError(f"{', '.join(given)} without --lora-rank", hint="add --lora-rank R (e.g. 8) for LoRA")
        return None
    if rank < 1:
        raise UsageError(f"--lora-rank {rank}: expected an integer >= 1", hint="e.g. --lora-rank 8 (16, 64 for more capacity)")
    if alpha is not None and not alpha > 0:
        raise UsageError(f"--lora-alpha {alpha}: expected > 0", hint=f"e.g. --lora-alpha {2 * rank} (2 x rank)")
    if dropout is not None and not 0.0 <= dropout < 1.0:
        raise UsageError(f"--lora-dropout {dropout}: expected a value in [0, 1)", hint="e.g. --lora-dropout 0.05, or 0")
    if bits is not None and bits != 4:
        raise UsageError(f"--lora-bits {bits}: only 4 (QLoRA, NF4) is supported", hint="--lora-bits 4, or drop it")
    return LoraSettings(rank=rank, alpha=float(alpha if alpha is not None else 2 * rank),
                        dropout=float(dropout or 0.0), targets=resolve_targets(family=family, targets=targets),
                        bits=bits, fan_in_fan_out=family == "gpt2")


def check_qlora(settings: LoraSettings, *, pretrained: bool) -> None:
    """QLoRA needs bitsandbytes' 4-bit kernels (CUDA) and real weights to quantize: refuse otherwise."""
    if settings.bits is None:
        return
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        raise DstkError("--lora-bits 4 (QLoRA) needs bitsandbytes' 4-bit kernels, which run on CUDA GPUs; "
                        "this machine has no CUDA GPU",
                        hint="run on a machine with a CUDA GPU and `pip install bitsandbytes`, or drop --lora-bits "
                             "to train LoRA adapters on full-precision base weights here")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise DstkError("--lora-bits 4 (QLoRA) needs bitsandbytes, which is not installed",
                        hint="pip install bitsandbytes, or drop --lora-bits")
    if not pretrained:
        raise DstkError("--lora-bits 4 quantizes pretrained weights, and this model has none (random init)",
                        hint="pass --model HF_DIR with weights, or drop --lora-bits")


def apply(model, settings: LoraSettings):
    """Wrap ``model`` with peft's LoRA adapters; the base weights are frozen (requires_grad False)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=list(settings.targets), fan_in_fan_out=settings.fan_in_fan_out,
                        bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def is_adapter_key(name: str) -> bool:
    """A state-dict key of an adapter weight (``...lora_A.default.weight``)."""
    return ".lora_" in name
