"""Mixtral 8x7B and 8x22B (``MixtralForCausalLM``): Mistral attention with a sparse MoE MLP,
8 SwiGLU experts per layer, 2 routed per token, so ``num_active_params`` < ``num_params``.
Source: Jiang et al. 2024; tensor list as in ``transformers/models/mixtral/modeling_mixtral.py``
(transformers 5 fuses the experts into ``gate_up_proj`` and ``down_proj``).

Sliding window: ``MixtralConfig.sliding_window`` (default None) on every layer, as Mistral's. The
published ``mistralai/Mixtral-8x7B-v0.1`` and ``Mixtral-8x22B-v0.1`` configs say
``"sliding_window": null``; the presets state it."""

from __future__ import annotations

import dataclasses

from dstk.models.llama_shaped import LlamaShaped
from dstk.models.spec import ModelSpec

SHAPE = LlamaShaped(family="mixtral", architecture="MixtralForCausalLM", qkv_bias=False, o_bias=False, moe=True,
                    defaults={"rope_theta": 1e6, "num_local_experts": 8, "num_experts_per_tok": 2})
FAMILY, HF_ARCHITECTURE, MODULES, PIPELINE_ADAPTER = SHAPE.exports
hf_config, preset = SHAPE.hf_config, SHAPE.preset


def read(cfg: dict, *, name: str) -> ModelSpec:
    """The Llama-shaped spec plus the config's ``sliding_window`` (absent or null: none)."""
    return dataclasses.replace(SHAPE.read(cfg, name=name), sliding_window=cfg.get("sliding_window"))


PRESETS = {
    "mixtral-8x7b": preset(4096, 32, 32, 8, 14336, 32000, 32768, sliding_window=None),
    "mixtral-8x22b": preset(6144, 56, 48, 8, 16384, 32768, 65536, sliding_window=None),
}
