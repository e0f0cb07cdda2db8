"""Qwen3 dense models (``Qwen3ForCausalLM``): Llama-shaped, no q/k/v bias, an RMSNorm over
``head_dim`` on queries and keys (QK-norm), ``head_dim`` 128 independent of the width. Source:
Qwen3 technical report (2025); tensor list as in ``transformers/models/qwen3/modeling_qwen3.py``."""

from __future__ import annotations

from dstk.models.llama import MODULES, llama_like
from dstk.models.spec import ModelSpec

FAMILY = "qwen3"
HF_ARCHITECTURE = "Qwen3ForCausalLM"
MODULES = {**MODULES, "attention": MODULES["attention"] + ("self_attn.q_norm", "self_attn.k_norm")}


def _qwen3(h, layers, heads, kv, ffn, *, tied=False):
    return {"model_type": FAMILY, "hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "head_dim": 128, "intermediate_size": ffn, "vocab_size": 151936,
            "max_position_embeddings": 40960, "tie_word_embeddings": tied, "rope_theta": 1e6}


PRESETS = {
    "qwen3-0.6b": _qwen3(1024, 28, 16, 8, 3072, tied=True),
    "qwen3-1.7b": _qwen3(2048, 28, 16, 8, 6144, tied=True),
    "qwen3-4b": _qwen3(2560, 36, 32, 8, 9728, tied=True),
    "qwen3-8b": _qwen3(4096, 36, 32, 8, 12288),
    "qwen3-14b": _qwen3(5120, 40, 40, 8, 17408),
    "qwen3-32b": _qwen3(5120, 64, 64, 8, 25600),
}


def read(cfg: dict, *, name: str) -> ModelSpec:
    bias = bool(cfg.get("attention_bias", False))
    return llama_like(cfg, name=name, family=FAMILY, qkv_bias=bias, o_bias=bias, qk_norm=True)


def hf_config(spec: ModelSpec) -> dict:
    return dict(spec.hf_config)


# --- Pipeline adapter (issue 5, dstk.pipeline) ------------------------------------------------
# Where the HF model keeps what dstk.pipeline cuts into stages (docs/pipeline.md). No torch here.
from dstk.pipeline.adapter import PipelineAdapter  # noqa: E402

# Per-layer masks from config.layer_types (mask='auto'); q/k norms live inside the layers.

PIPELINE_ADAPTER = PipelineAdapter(
    family=FAMILY,
    embed_parts=(("tokens", MODULES["embed"]),),
    layers=MODULES["layers"],
    final_parts=(("norm", MODULES["final_norm"]),),
    head=MODULES["lm_head"],
    rotary="model.rotary_emb",
)
