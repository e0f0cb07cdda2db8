"""Mistral 7B and Mistral NeMo (``MistralForCausalLM``): a Llama-shaped decoder without biases,
grouped-query attention, an explicit ``head_dim`` in NeMo. Source: Jiang et al. 2023; tensor list
as in ``transformers/models/mistral/modeling_mistral.py``."""

from __future__ import annotations

from dstk.models.llama import MODULES, llama_like
from dstk.models.spec import ModelSpec

FAMILY = "mistral"
HF_ARCHITECTURE = "MistralForCausalLM"
MODULES = dict(MODULES)


def _mistral(h, layers, heads, kv, ffn, vocab, positions, *, theta=10000.0, head_dim=None):
    cfg = {"model_type": FAMILY, "hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv, "intermediate_size": ffn, "vocab_size": vocab,
           "max_position_embeddings": positions, "tie_word_embeddings": False, "rope_theta": theta}
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    return cfg


PRESETS = {
    "mistral-7b": _mistral(4096, 32, 32, 8, 14336, 32000, 32768),
    "mistral-7b-v0.3": _mistral(4096, 32, 32, 8, 14336, 32768, 32768, theta=1e6),
    "mistral-nemo-12b": _mistral(5120, 40, 32, 8, 14336, 131072, 131072, theta=1e6, head_dim=128),
}


def read(cfg: dict, *, name: str) -> ModelSpec:
    return llama_like(cfg, name=name, family=FAMILY, qkv_bias=False, o_bias=False)


def hf_config(spec: ModelSpec) -> dict:
    return dict(spec.hf_config)


# --- Pipeline adapter (issue 5, dstk.pipeline) ------------------------------------------------
# Where the HF model keeps what dstk.pipeline cuts into stages (docs/pipeline.md). No torch here.
from dstk.pipeline.adapter import PipelineAdapter  # noqa: E402

# The sliding-window mask when config.sliding_window is set (mask='auto').

PIPELINE_ADAPTER = PipelineAdapter(
    family=FAMILY,
    embed_parts=(("tokens", MODULES["embed"]),),
    layers=MODULES["layers"],
    final_parts=(("norm", MODULES["final_norm"]),),
    head=MODULES["lm_head"],
    rotary="model.rotary_emb",
)
