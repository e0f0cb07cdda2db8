"""Mistral 7B and Mistral NeMo (``MistralForCausalLM``): Llama-shaped without biases, grouped-query
attention, a sliding-window mask when ``sliding_window`` is set, an explicit ``head_dim`` in NeMo.
Source: Jiang et al. 2023; tensor list as in ``transformers/models/mistral/modeling_mistral.py``."""

from __future__ import annotations

from dstk.models.llama_shaped import LlamaShaped

SHAPE = LlamaShaped(family="mistral", architecture="MistralForCausalLM", qkv_bias=False, o_bias=False,
                    defaults={"rope_theta": 10000.0})
FAMILY, HF_ARCHITECTURE, MODULES, PIPELINE_ADAPTER = SHAPE.exports
read, hf_config, preset = SHAPE.read, SHAPE.hf_config, SHAPE.preset

PRESETS = {
    "mistral-7b": preset(4096, 32, 32, 8, 14336, 32000, 32768),
    "mistral-7b-v0.3": preset(4096, 32, 32, 8, 14336, 32768, 32768, rope_theta=1e6),
    "mistral-nemo-12b": preset(5120, 40, 32, 8, 14336, 131072, 131072, rope_theta=1e6, head_dim=128),
}
