"""The layer modules a pipeline is made of, and what passes between them.

Between stages only ``(hidden, attention_mask, position_ids)`` travels: the float hidden state
first (it needs grad, and DeepSpeed indexes gradient buffers by floating outputs), then the int64
2-D padding mask and int64 position ids. No bools, no None, no cos/sin: every decoder layer
rebuilds its 4-D mask and rotary (cos, sin) from the ints, with the same transformers functions
the HF model uses, so a stage boundary may fall anywhere.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dstk.pipeline.adapter import PipelineAdapter


def position_ids_for(rule: str, attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids as the family's HF forward computes them with no cache."""
    if rule == "cumsum":  # OPT: cumsum(mask) * mask - 1, so left padding does not shift positions
        return (torch.cumsum(attention_mask, dim=1) * attention_mask - 1).long()
    seq = attention_mask.shape[1]
    return torch.arange(seq, device=attention_mask.device).unsqueeze(0).expand_as(attention_mask).contiguous()


class EmbedPipe(nn.Module):
    """First stage: ``input_ids`` or ``(input_ids, attention_mask)`` -> ``(hidden, mask, pos)``."""

    def __init__(self, source: Any, *, adapter: PipelineAdapter, roles: tuple[str, ...] | None = None):
        super().__init__()
        for role, path in adapter.embed_parts:
            if roles is None or role in roles:
                self.add_module(role, source.module(path))
        self._adapter = adapter

    def forward(self, inputs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if isinstance(inputs, (tuple, list)):
            input_ids, attention_mask = (inputs[0], inputs[1]) if len(inputs) > 1 else (inputs[0], None)
        else:
            input_ids, attention_mask = inputs, None
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        attention_mask = attention_mask.long()
        position_ids = position_ids_for(self._adapter.positions, attention_mask)
        parts = dict(self.named_children())
        if self._adapter.embed_fn is not None:
            hidden = self._adapter.embed_fn(parts, input_ids, position_ids, attention_mask)
        else:
            hidden = self.tokens(input_ids)
            if "positions" in parts:
                hidden = hidden + self.positions(position_ids)
            if "project_in" in parts:
                hidden = self.project_in(hidden)
            if "dropout" in parts:
                hidden = self.dropout(hidden)
        return hidden, attention_mask, position_ids


def layer_mask(config: Any, adapter: PipelineAdapter, layer_idx: int, hidden: torch.Tensor,
               attention_mask: torch.Tensor, position_ids: torch.Tensor) -> Any:
    """The 4-D mask (or None, for sdpa without padding) that HF gives decoder layer ``layer_idx``."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    kind = "full_attention"
    if adapter.mask == "auto":
        layer_types = getattr(config, "layer_types", None)
        if layer_types:
            kind = layer_types[layer_idx]
        elif getattr(config, "sliding_window", None) is not None:
            kind = "sliding_attention"
    make = create_sliding_window_causal_mask if kind == "sliding_attention" else create_causal_mask
    kwargs = {"position_ids": position_ids} if adapter.mask_uses_position_ids else {}
    return make(config=config, inputs_embeds=hidden, attention_mask=attention_mask, cache=None, **kwargs)


class DecoderPipe(nn.Module):
    """One HF decoder layer; rebuilds its mask and rotary from the ints it is passed."""

    def __init__(self, source: Any, *, layer_idx: int, config: Any, adapter: PipelineAdapter):
        super().__init__()
        self.layer = source.module(f"{adapter.layers}.{layer_idx}")
        rotary = source.module(adapter.rotary) if adapter.rotary else None
        # A tuple hides the shared rotary from this layer's state_dict and parameters: it has
        # only non-persistent buffers and belongs to no single layer.
        self._rotary = (rotary,) if rotary is not None else ()
        self._layer_idx = layer_idx
        self._config = config
        self._adapter = adapter

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]):
        hidden, attention_mask, position_ids = inputs
        mask = layer_mask(self._config, self._adapter, self._layer_idx, hidden, attention_mask, position_ids)
        kwargs: dict[str, Any] = {"attention_mask": mask, "position_ids": position_ids, "use_cache": False}
        if self._rotary:
            rotary = self._rotary[0].to(hidden.device)
            kwargs["position_embeddings"] = rotary(hidden, position_ids)
        out = self.layer(hidden, **kwargs)
        if isinstance(out, tuple):  # transformers 4.x layers return tuples; 5.x a tensor
            out = out[0]
        return out, attention_mask, position_ids


class FinalPipe(nn.Module):
    """Final norm (and OPT's ``project_out``): ``(hidden, mask, pos)`` -> ``hidden``."""

    def __init__(self, source: Any, *, adapter: PipelineAdapter):
        super().__init__()
        for role, path in adapter.final_parts:
            self.add_module(role, source.module(path))

    def forward(self, inputs: Any) -> torch.Tensor:
        hidden = inputs[0] if isinstance(inputs, tuple) else inputs
        if "norm" in self._modules:
            hidden = self.norm(hidden)
        if "project_out" in self._modules:
            hidden = self.project_out(hidden)
        return hidden


def _softcap(logits: torch.Tensor, config: Any) -> torch.Tensor:
    cap = getattr(config, "final_logit_softcapping", None)
    if cap is None:
        return logits
    return torch.tanh(logits / cap) * cap  # Gemma2's ForCausalLM.forward


class HeadPipe(nn.Module):
    """Untied output projection: ``hidden`` -> ``logits``."""

    def __init__(self, source: Any, *, adapter: PipelineAdapter, config: Any):
        super().__init__()
        self.head = source.module(adapter.head)
        self._config = config

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return _softcap(self.head(hidden), self._config)


class TiedHead:
    """The ``forward_fn`` of the last stage's ``TiedLayerSpec``: logits from the shared
    embedding matrix (tied HF heads have no bias)."""

    def __init__(self, *, config: Any):
        self._config = config

    def __call__(self, embed: EmbedPipe, hidden: torch.Tensor) -> torch.Tensor:
        return _softcap(nn.functional.linear(hidden, embed.tokens.weight), self._config)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """HF's causal-LM loss: predict token t+1 from position t, mean over labels != -100,
    computed in fp32 (``transformers.loss.loss_utils.ForCausalLMLoss``)."""
    shift_logits = logits[:, :-1, :].float().reshape(-1, logits.shape[-1])
    shift_labels = labels[:, 1:].reshape(-1).to(shift_logits.device)
    return nn.functional.cross_entropy(shift_logits, shift_labels, ignore_index=-100)
