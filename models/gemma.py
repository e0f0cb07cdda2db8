"""Gemma 1 (``GemmaForCausalLM``): Llama-shaped with GeGLU, ``head_dim`` 256, a 256k vocabulary
and tied embeddings (the embedding is most of Gemma-2B). Source: Gemma Team 2024; tensor list as
in ``transformers/models/gemma/modeling_gemma.py``."""

from __future__ import annotations

from dstk.models.llama import MODULES, llama_like
from dstk.models.spec import ModelSpec

FAMILY = "gemma"
HF_ARCHITECTURE = "GemmaForCausalLM"
MODULES = dict(MODULES)


def _gemma(h, layers, heads, kv, ffn):
    return {"model_type": FAMILY, "hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "head_dim": 256, "intermediate_size": ffn, "vocab_size": 256000,
            "max_position_embeddings": 8192, "tie_word_embeddings": True, "hidden_act": "gelu_pytorch_tanh"}


PRESETS = {
    "gemma-2b": _gemma(2048, 18, 8, 1, 16384),
    "gemma-7b": _gemma(3072, 28, 16, 16, 24576),
}


def read(cfg: dict, *, name: str) -> ModelSpec:
    bias = bool(cfg.get("attention_bias", False))
    return llama_like(cfg, name=name, family=FAMILY, qkv_bias=bias, o_bias=bias, tied_default=True)


def hf_config(spec: ModelSpec) -> dict:
    return dict(spec.hf_config)


# --- Pipeline adapter (issue 5, dstk.pipeline) ------------------------------------------------
# Where the HF model keeps what dstk.pipeline cuts into stages (docs/pipeline.md). No torch here.
from dstk.pipeline.adapter import PipelineAdapter  # noqa: E402

# The embedding scales by sqrt(hidden) itself (a non-persistent buffer); tied head by default.

PIPELINE_ADAPTER = PipelineAdapter(
    family=FAMILY,
    embed_parts=(("tokens", MODULES["embed"]),),
    layers=MODULES["layers"],
    final_parts=(("norm", MODULES["final_norm"]),),
    head=MODULES["lm_head"],
    rotary="model.rotary_emb",
)
