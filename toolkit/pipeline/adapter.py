"""What dstk needs to know about an HF causal-LM family to cut it into pipeline stages.

A family is described by data (``PipelineAdapter``: where its embeddings, decoder layers, final
norm and head live, how it numbers positions, which attention mask each layer gets) plus at most
two small functions for what runs before the layers and after them. Llama-like models (Llama,
Mistral, Qwen2, Qwen3, Gemma, ...) need nothing but the generic discovery in ``discover``; other
families put a ``PIPELINE_ADAPTER`` at the end of their file in ``models/``.

No torch at import time: ``dstk.models`` re-exports from here lazily.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dstk.errors import DstkError

POSITION_RULES = ("arange", "cumsum")
MASK_RULES = ("auto", "causal")


@dataclass(kw_only=True, frozen=True, slots=True)
class PipelineAdapter:
    """Where one HF family keeps its pieces, by module path inside ``*ForCausalLM``."""

    family: str
    """The HF ``config.model_type`` this adapter is for ("llama", "gpt2", ...)."""
    embed_parts: tuple[tuple[str, str], ...]
    """Role -> module path for everything before the first decoder layer. Roles: ``tokens``
    (required), ``positions`` (learned positions), ``project_in``, ``dropout``."""
    layers: str
    """Module path of the ``ModuleList`` of decoder layers."""
    final_parts: tuple[tuple[str, str], ...] = ()
    """Role -> module path for what runs after the last layer: ``norm``, ``project_out``."""
    head: str = "lm_head"
    """Module path of the output projection."""
    rotary: str | None = None
    """Module path of the shared rotary embedding; its (cos, sin) go to every layer."""
    positions: str = "arange"
    """Position ids: ``arange`` (0..T-1 whatever the padding, as Llama/GPT-2 do) or ``cumsum``
    (count of real tokens so far minus one, as OPT does)."""
    mask: str = "auto"
    """``auto``: per-layer ``config.layer_types`` if present, else sliding-window when
    ``config.sliding_window`` is set, else causal. ``causal``: always the causal mask."""
    mask_uses_position_ids: bool = True
    """Whether the family passes position_ids to ``create_causal_mask`` (OPT does not)."""
    embed_fn: Callable[..., Any] | None = None
    """``embed_fn(parts, input_ids, position_ids, attention_mask) -> hidden``; None: tokens,
    plus positions(position_ids) if present, then project_in and dropout if present."""
    saved_prefixes: tuple[tuple[str, str], ...] = field(default=())
    """In-memory prefix -> prefix in a ``save_pretrained`` checkpoint, where they differ
    (GPT-NeoX keeps ``lm_head`` in memory but saves ``embed_out``)."""

    def __post_init__(self) -> None:
        roles = dict(self.embed_parts)
        if "tokens" not in roles:
            raise ValueError(f"embed_parts: needs a 'tokens' role, got {sorted(roles)}")
        if self.positions not in POSITION_RULES:
            raise ValueError(f"positions: {self.positions!r} is not one of {POSITION_RULES}")
        if self.mask not in MASK_RULES:
            raise ValueError(f"mask: {self.mask!r} is not one of {MASK_RULES}")


_NORM_NAMES = ("norm", "final_layernorm", "final_layer_norm", "ln_f")


def _path_of(root: Any, module: Any) -> str | None:
    for name, sub in root.named_modules():
        if sub is module:
            return name
    return None


def discover(model: Any) -> PipelineAdapter:
    """Find the pieces of a Llama-like ``*ForCausalLM``: input embeddings, the decoder
    ``ModuleList``, a final norm, the head and a rotary embedding; say what is missing."""
    import torch

    config = model.config
    base_prefix = getattr(model, "base_model_prefix", "model")
    base = getattr(model, base_prefix, None)
    missing: list[str] = []
    if base is None:
        missing.append(f"the base model (attribute {base_prefix!r})")
        base = model
    embed = model.get_input_embeddings()
    head = model.get_output_embeddings()
    embed_path = _path_of(model, embed) if embed is not None else None
    head_path = _path_of(model, head) if head is not None else None
    if embed_path is None:
        missing.append("input embeddings (get_input_embeddings)")
    if head_path is None:
        missing.append("output head (get_output_embeddings)")

    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    layers_path = None
    for name, sub in base.named_children():
        if isinstance(sub, torch.nn.ModuleList) and len(sub) and (
            not layer_classes or type(sub[0]).__name__ in layer_classes
        ):
            layers_path = f"{base_prefix}.{name}"
            break
    if layers_path is None:
        missing.append(f"decoder layers (a ModuleList of {sorted(layer_classes) or 'layers'} under {base_prefix})")
    norm_path = next((f"{base_prefix}.{n}" for n in _NORM_NAMES if getattr(base, n, None) is not None), None)
    if norm_path is None:
        missing.append(f"a final norm (one of {', '.join(_NORM_NAMES)} under {base_prefix})")
    rotary = getattr(base, "rotary_emb", None)
    if rotary is None:
        missing.append(f"a shared rotary embedding ({base_prefix}.rotary_emb)")
    else:
        import inspect

        if "layer_type" in inspect.signature(rotary.forward).parameters:
            missing.append("one (cos, sin) for all layers (this model's rotary differs per layer type)")
    if layers_path is not None:
        import inspect

        first = model.get_submodule(layers_path)[0]
        if "position_embeddings" not in inspect.signature(first.forward).parameters:
            missing.append(f"decoder layers that take position_embeddings ({type(first).__name__} does not)")
    known = {embed_path, layers_path, norm_path, f"{base_prefix}.rotary_emb"}
    extras = []
    for name, sub in base.named_children():
        if f"{base_prefix}.{name}" in known:
            continue
        # a child with weights, or a live dropout, would run in HF's forward but not in ours
        if any(True for _ in sub.parameters()) or (isinstance(sub, torch.nn.Dropout) and sub.p > 0):
            extras.append(name)
    if extras:
        missing.append(f"a place for {', '.join(extras)} (run by {type(base).__name__} around the layers)")
    if missing:
        raise DstkError(
            f"cannot wrap {type(model).__name__} (model_type {config.model_type!r}) into pipeline stages: "
            f"missing {'; '.join(missing)}",
            hint="add a PIPELINE_ADAPTER for this family at the end of its file in models/ "
            "(see docs/pipeline.md, 'Adding a family')",
        )
    return PipelineAdapter(
        family=config.model_type,
        embed_parts=(("tokens", embed_path),),
        layers=layers_path,
        final_parts=(("norm", norm_path),),
        head=head_path,
        rotary=f"{base_prefix}.rotary_emb",
    )


def adapter_for(model: Any) -> PipelineAdapter:
    """The family's ``PIPELINE_ADAPTER`` from ``dstk.models.<model_type>`` if it has one, else
    the generic Llama-like discovery (which names what is missing when it fails)."""
    model_type = model.config.model_type
    try:
        module = importlib.import_module(f"dstk.models.{model_type}")
    except ImportError:
        module = None
    adapter = getattr(module, "PIPELINE_ADAPTER", None)
    adapter = adapter if adapter is not None else discover(model)
    return without_absent_parts(adapter, model)


def without_absent_parts(adapter: PipelineAdapter, model: Any) -> PipelineAdapter:
    """Drop optional parts this configuration does not have (OPT's ``project_in`` is None
    unless ``word_embed_proj_dim`` differs from ``hidden_size``)."""
    import dataclasses

    def present(path: str) -> bool:
        parent, _, name = path.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        return getattr(owner, name, None) is not None

    return dataclasses.replace(
        adapter,
        embed_parts=tuple((r, p) for r, p in adapter.embed_parts if r == "tokens" or present(p)),
        final_parts=tuple((r, p) for r, p in adapter.final_parts if present(p)),
    )
