"""The Llama-shaped decoder that most families are, defined once: a family states only how it
differs from Llama.

Llama, Mistral, Mixtral, Qwen2, Qwen3 and Gemma share the module layout of
``LlamaForCausalLM`` (``model.embed_tokens``, ``model.layers``, ``model.norm``, ``lm_head``,
``model.rotary_emb``), the layer (RMSNorm, q/k/v/o, RMSNorm, SwiGLU MLP; tensor arithmetic in
``dstk.models.spec.llama_like``) and so the pipeline adapter. What differs is data: biases on
q/k/v and o, RMSNorms on q and k, whether the embedding is tied by default, a sparse MoE MLP,
and the preset defaults (vocabulary, head_dim, activation, rope theta). A new Llama-shaped family
is a file with a ``LlamaShaped`` and its presets:

    SHAPE = LlamaShaped(family="qwen2", architecture="Qwen2ForCausalLM", qkv_bias=True, o_bias=False,
                        defaults={"rope_theta": 1e6, "max_position_embeddings": 32768})
    FAMILY, HF_ARCHITECTURE, MODULES, PIPELINE_ADAPTER = SHAPE.exports
    read, hf_config, preset = SHAPE.read, SHAPE.hf_config, SHAPE.preset
    PRESETS = {"qwen2.5-7b": preset(3584, 28, 28, 4, 18944, 152064)}

No torch here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dstk.models.spec import EagerLayer, ModelSpec, llama_like
from dstk.pipeline.adapter import PipelineAdapter

MODULES: dict[str, Any] = {
    "embed": "model.embed_tokens",
    "layers": "model.layers",
    "final_norm": "model.norm",
    "lm_head": "lm_head",
    "attention": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"),
    "mlp": ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
    "norms": ("input_layernorm", "post_attention_layernorm"),
}
"""Module names inside ``LlamaForCausalLM`` (LoRA targets, pipeline cuts)."""


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class LlamaShaped:
    """How one Llama-shaped family differs from Llama."""

    family: str
    """HF ``model_type``."""
    architecture: str
    """HF class name (``Qwen2ForCausalLM``)."""
    qkv_bias: bool | None = None
    """Biases on q/k/v; None: the config's ``attention_bias`` (Llama, Gemma, Qwen3; default False)."""
    o_bias: bool | None = None
    """Bias on o_proj; None: the config's ``attention_bias``."""
    qk_norm: bool = False
    """An RMSNorm over ``head_dim`` on queries and keys (Qwen3)."""
    tied: bool = False
    """``tie_word_embeddings`` when the config does not say (Gemma: True)."""
    moe: bool = False
    """Sparse MoE MLP: ``num_local_experts`` SwiGLU experts, ``num_experts_per_tok`` routed (Mixtral)."""
    defaults: dict = dataclasses.field(default_factory=dict)
    """HF config keys every preset of the family shares (vocab_size, head_dim, hidden_act, ...)."""
    eager: EagerLayer = EagerLayer()
    """How the family's modeling code differs from Llama's when run eagerly (Gemma: the norm's
    weight product in fp32); biases are added from the config by ``read``."""

    @property
    def modules(self) -> dict[str, Any]:
        out = dict(MODULES)
        if self.qk_norm:
            out["attention"] = MODULES["attention"] + ("self_attn.q_norm", "self_attn.k_norm")
        if self.moe:
            out["mlp"] = ("mlp.gate", "mlp.experts.gate_up_proj", "mlp.experts.down_proj")
        return out

    @property
    def pipeline_adapter(self) -> PipelineAdapter:
        """Where dstk.pipeline cuts the model (docs/pipeline.md). Sliding-window and per-layer
        masks (Mistral, Qwen2/3: ``config.layer_types``) come from ``mask='auto'``; Gemma's
        embedding scales by sqrt(hidden) itself (a non-persistent buffer)."""
        return PipelineAdapter(
            family=self.family,
            embed_parts=(("tokens", MODULES["embed"]),),
            layers=MODULES["layers"],
            final_parts=(("norm", MODULES["final_norm"]),),
            head=MODULES["lm_head"],
            rotary="model.rotary_emb",
        )

    @property
    def exports(self) -> tuple[str, str, dict[str, Any], PipelineAdapter]:
        """``FAMILY, HF_ARCHITECTURE, MODULES, PIPELINE_ADAPTER`` for the family file."""
        return self.family, self.architecture, self.modules, self.pipeline_adapter

    def preset(self, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int, ffn_hidden_size: int,
               vocab_size: int | None = None, max_positions: int | None = None, **keys: Any) -> dict:
        """An HF config dict (``model_type`` first) from the dimensions, the family's defaults and
        any other HF keys given by name (``rope_theta=5e5``, ``tie_word_embeddings=True``)."""
        cfg = {"model_type": self.family, "hidden_size": hidden_size, "num_hidden_layers": num_layers,
               "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads,
               "intermediate_size": ffn_hidden_size, "tie_word_embeddings": self.tied, **self.defaults}
        if vocab_size is not None:
            cfg["vocab_size"] = vocab_size
        if max_positions is not None:
            cfg["max_position_embeddings"] = max_positions
        return {**cfg, **keys}

    def read(self, cfg: dict, *, name: str) -> ModelSpec:
        """A spec from the family's ``config.json``."""
        bias = bool(cfg.get("attention_bias", False))
        return llama_like(
            cfg, name=name, family=self.family,
            qkv_bias=bias if self.qkv_bias is None else self.qkv_bias,
            o_bias=bias if self.o_bias is None else self.o_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)), qk_norm=self.qk_norm, tied_default=self.tied,
            num_experts=cfg.get("num_local_experts", 8) if self.moe else 1,
            experts_per_token=cfg.get("num_experts_per_tok", 2) if self.moe else 1, eager=self.eager,
        )

    def hf_config(self, spec: ModelSpec) -> dict:
        """The keys that build the real model (``AutoConfig.for_model(**keys)``)."""
        return dict(spec.hf_config)
