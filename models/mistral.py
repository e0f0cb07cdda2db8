"""Mistral 7B and Mistral NeMo (``MistralForCausalLM``): Llama-shaped without biases, grouped-query
attention, a sliding-window mask when ``sliding_window`` is set, an explicit ``head_dim`` in NeMo.
Source: Jiang et al. 2023; tensor list as in ``transformers/models/mistral/modeling_mistral.py``.

The window is explicit in every preset because ``MistralConfig`` defaults ``sliding_window`` to
4096: left out, every preset would train with a 4096-token window. The published HF configs:
``mistralai/Mistral-7B-v0.1`` ``"sliding_window": 4096``; ``mistralai/Mistral-7B-v0.3`` and
``mistralai/Mistral-Nemo-Base-2407`` ``"sliding_window": null`` (full causal attention)."""

from __future__ import annotations

import dataclasses

from dstk.models.llama_shaped import LlamaShaped
from dstk.models.spec import ModelSpec

SHAPE = LlamaShaped(family="mistral", architecture="MistralForCausalLM", qkv_bias=False, o_bias=False,
                    defaults={"rope_theta": 10000.0})
FAMILY, HF_ARCHITECTURE, MODULES, PIPELINE_ADAPTER = SHAPE.exports
hf_config, preset = SHAPE.hf_config, SHAPE.preset

CONFIG_DEFAULT_WINDOW = 4096
"""``MistralConfig``'s ``sliding_window`` when a config.json does not give the key (transformers 5.25)."""


def read(cfg: dict, *, name: str) -> ModelSpec:
    """The Llama-shaped spec plus the window transformers will apply: the config's
    ``sliding_window`` (null: none), ``MistralConfig``'s 4096 when the key is absent."""
    window = cfg.get("sliding_window", CONFIG_DEFAULT_WINDOW)
    return dataclasses.replace(SHAPE.read(cfg, name=name), sliding_window=window)


PRESETS = {
    "mistral-7b": preset(4096, 32, 32, 8, 14336, 32000, 32768, sliding_window=4096),
    "mistral-7b-v0.3": preset(4096, 32, 32, 8, 14336, 32768, 32768, rope_theta=1e6, sliding_window=None),
    "mistral-nemo-12b": preset(5120, 40, 32, 8, 14336, 131072, 131072, rope_theta=1e6, head_dim=128,
                               sliding_window=None),
}
