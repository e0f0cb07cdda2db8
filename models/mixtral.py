"""Mixtral 8x7B and 8x22B (``MixtralForCausalLM``): Mistral attention with a sparse MoE MLP,
8 SwiGLU experts per layer, 2 routed per token, so ``num_active_params`` < ``num_params``.
Source: Jiang et al. 2024; tensor list as in ``transformers/models/mixtral/modeling_mixtral.py``
(transformers 5 fuses the experts into ``gate_up_proj`` and ``down_proj``)."""

from __future__ import annotations

from dstk.models.llama import llama_like
from dstk.models.spec import ModelSpec

FAMILY = "mixtral"
HF_ARCHITECTURE = "MixtralForCausalLM"
MODULES = {
    "embed": "model.embed_tokens",
    "layers": "model.layers",
    "final_norm": "model.norm",
    "lm_head": "lm_head",
    "attention": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"),
    "mlp": ("mlp.gate", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"),
    "norms": ("input_layernorm", "post_attention_layernorm"),
}


def _mixtral(h, layers, heads, kv, ffn, vocab, positions, *, theta=1e6):
    return {"model_type": FAMILY, "hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "intermediate_size": ffn, "vocab_size": vocab,
            "max_position_embeddings": positions, "tie_word_embeddings": False, "rope_theta": theta,
            "num_local_experts": 8, "num_experts_per_tok": 2}


PRESETS = {
    "mixtral-8x7b": _mixtral(4096, 32, 32, 8, 14336, 32000, 32768),
    "mixtral-8x22b": _mixtral(6144, 56, 48, 8, 16384, 32768, 65536),
}


def read(cfg: dict, *, name: str) -> ModelSpec:
    return llama_like(cfg, name=name, family=FAMILY, qkv_bias=False, o_bias=False,
                      num_experts=cfg.get("num_local_experts", 8), experts_per_token=cfg.get("num_experts_per_tok", 2))


def hf_config(spec: ModelSpec) -> dict:
    return dict(spec.hf_config)
