"""``ModelSpec``: what the estimator and the planner know of a decoder-only transformer.

A spec is built from the list of parameter tensors of one model, part by part (input embedding,
one transformer layer, final norm, lm_head), so the parameter count is exact by construction:
each family file lists the tensors its HF module creates, and ``tests/test_models.py`` checks the
sum against the real transformers model built on the meta device. No torch here.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Norm = Literal["rmsnorm", "layernorm"]


def linear(fan_in: int, fan_out: int, bias: bool) -> tuple[int, ...]:
    """Tensor sizes of ``nn.Linear(fan_in, fan_out, bias)``: weight, then bias."""
    return (fan_in * fan_out, fan_out) if bias else (fan_in * fan_out,)


def norm(width: int, *, bias: bool) -> tuple[int, ...]:
    """Tensor sizes of a LayerNorm (weight + bias) or an RMSNorm (weight only)."""
    return (width, width) if bias else (width,)


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class EagerLayer:
    """How HF transformers' modeling code runs one layer eagerly, beyond what the tensor sizes say:
    what ``dstk.estimate.timing.eager_elementwise_bytes_per_token`` needs to count the bytes of its
    non-GEMM ops (each field is one of its keyword arguments; the docstring there prices each)."""

    norm_weight_fp32: bool = False
    """RMSNorm multiplies by its weight in fp32 before casting back (Gemma's ``1 + weight``)."""
    qkv_bias: bool = False
    """Biases on q/k/v only, no MLP bias (Qwen2)."""
    o_bias: bool = False
    """A bias on the attention output projection only."""
    qkv_split: str = "split"
    """How a fused QKV output is cut: ``split`` (GPT-2, Falcon-7B's multi-query), ``unbind``
    (classic Falcon), ``view`` (per-head view + chunk: GPT-NeoX), ``slice`` (Phi-3), ``select``
    (per-head view + select: BLOOM), ``group_select`` (Falcon's new decoder: per-KV-group view,
    q sliced, k/v selected)."""
    fused_gate_up: bool = False
    """One ``gate_up_proj`` whose output is chunked (Phi-3)."""
    rotary_fraction: float = 1.0
    """Share of each head that is rotated (GPT-NeoX's ``rotary_pct``, 0.25)."""
    rotary_cat: bool = False
    """Rotary splits each head into rotated and passed parts and concatenates them (GPT-NeoX, Phi-3)."""
    q_scale: bool = False
    """The query is scaled by ``head_dim ** -0.5`` in its own op (OPT)."""
    num_norms: int = 2
    """Norms over ``h`` per layer (Falcon-7B's parallel block: one)."""
    heads_reshaped: bool = False
    """q, k, v copied to ``(batch x heads, s, d)`` for an eager ``baddbmm`` attention (BLOOM)."""
    kv_repeated: bool = False
    """k/v repeated to the query heads by ``repeat_kv`` before SDPA (Falcon: SDPA gets a mask)."""

    def __post_init__(self) -> None:
        if self.qkv_split not in ("split", "unbind", "view", "slice", "select", "group_select"):
            raise ValueError(f"qkv_split: expected split, unbind, view, slice, select or group_select, "
                             f"got {self.qkv_split!r}")
        if not 0.0 < self.rotary_fraction <= 1.0:
            raise ValueError(f"rotary_fraction: expected a share in (0, 1], got {self.rotary_fraction!r}")


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer: dimensions and the exact sizes of its parameter tensors."""

    name: str
    """Preset slug, config path or ``generic``."""
    family: str
    """HF ``model_type`` (``llama``, ``gpt2``, ...) or ``generic``."""
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    """Key/value heads (== num_heads without grouped-query attention; 1 for multi-query)."""
    head_dim: int
    vocab_size: int
    ffn_hidden_size: int
    """MLP inner width (per expert for MoE)."""
    seq_len: int | None = None
    """Longest sequence the model was built for (``max_position_embeddings``); None if unknown."""
    tied_embeddings: bool = False
    gated_mlp: bool = True
    """SwiGLU/GeGLU (three matrices) rather than a plain two-matrix MLP."""
    norm: Norm = "rmsnorm"
    activation: str = "silu"
    """MLP activation as HF names it (silu, gelu_new, gelu, relu, ...): decides what backward keeps."""
    dropout: float = 0.0
    """Attention/residual dropout the HF config trains with (GPT-2: 0.1; Llama-style: 0)."""
    rotary: bool = True
    """Rotary position embeddings (cos/sin tables saved once per forward) rather than learned ones."""
    num_experts: int = 1
    """Experts per MoE layer; 1 for a dense model."""
    experts_per_token: int = 1
    embedding_tensors: tuple[int, ...]
    """Sizes of the first stage's tensors before layer 0 (token and position embeddings, ...)."""
    layer_tensors: tuple[int, ...]
    """Sizes of the tensors of one transformer layer (all experts)."""
    expert_tensors: tuple[int, ...] = ()
    """Sizes of the tensors of one expert (a subset of ``layer_tensors``); empty when dense."""
    final_tensors: tuple[int, ...] = ()
    """Sizes of the last stage's tensors after the last layer, without the lm_head."""
    lm_head_tensors: tuple[int, ...] = ()
    """Sizes of the output projection's tensors; empty when tied to the input embedding."""
    eager: EagerLayer = EagerLayer()
    """How HF's modeling code runs the layer (what its eager bytes depend on beyond the sizes)."""
    attention_kernels: tuple[str, ...] = ("eager", "sdpa", "flash")
    """The ``--attention`` kernels the family's HF class can load with (``attn_implementation``):
    eager always; ``sdpa`` where the class declares ``_supports_sdpa``, ``flash``
    (``flash_attention_2``) where it declares ``_supports_flash_attn`` (transformers 5.25: every
    catalog family but BLOOM declares both; ``BloomForCausalLM`` neither, and ``from_pretrained``
    without ``attn_implementation`` falls back to eager: ``tests/test_attention_support.py``)."""
    sliding_window: int | None = None
    """Sliding-window attention span (HF ``sliding_window``: Mistral-7B-v0.1's 4096); None when every
    token attends to all before it. transformers hands SDPA an explicit mask (and repeats K/V) once
    a sequence reaches it (``steptime.sdpa_gets_mask``)."""
    sliding_layers: tuple[int, ...] | None = None
    """The layers (0-based) that apply ``sliding_window`` when only some do (Qwen2/Qwen3's
    ``layer_types``: ``sliding_attention`` from ``max_window_layers`` on); None: every layer."""
    hf_config: dict = dataclasses.field(default_factory=dict, compare=False, hash=False, repr=False)
    """The HF ``config.json`` keys that build the real transformers model (``model_type`` first)."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size",
                     "ffn_hidden_size", "num_experts", "experts_per_token"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads: {self.num_kv_heads} does not divide num_heads {self.num_heads}")
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token: {self.experts_per_token} > num_experts {self.num_experts}")
        if "eager" not in self.attention_kernels or not set(self.attention_kernels) <= {"eager", "sdpa", "flash"}:
            raise ValueError(f"attention_kernels: expected eager plus any of sdpa, flash, "
                             f"got {self.attention_kernels!r}")
        if self.sliding_window is not None and (isinstance(self.sliding_window, bool)
                                                or not isinstance(self.sliding_window, int) or self.sliding_window < 1):
            raise ValueError(f"sliding_window: expected a positive integer or None, got {self.sliding_window!r}")
        if self.sliding_layers is not None and (
                self.sliding_window is None or not self.sliding_layers
                or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.num_layers
                       for i in self.sliding_layers)
                or list(self.sliding_layers) != sorted(set(self.sliding_layers))):
            raise ValueError(f"sliding_layers: expected increasing layer indices below num_layers {self.num_layers} "
                             f"with a sliding_window (None: every layer), got {self.sliding_layers!r}")

    # --- counts (exact) ---------------------------------------------------------------------------

    @property
    def embedding_params(self) -> int:
        return sum(self.embedding_tensors)

    @property
    def layer_params(self) -> int:
        return sum(self.layer_tensors)

    @property
    def final_params(self) -> int:
        return sum(self.final_tensors)

    @property
    def lm_head_params(self) -> int:
        return sum(self.lm_head_tensors)

    @property
    def num_params(self) -> int:
        """Unique parameters (a tied lm_head counts once, as ``model.parameters()`` does)."""
        return self.embedding_params + self.num_layers * self.layer_params + self.final_params + self.lm_head_params

    @property
    def layer_active_params(self) -> int:
        """Parameters one token passes through in a layer: all but the unrouted experts."""
        unused = (self.num_experts - self.experts_per_token) * sum(self.expert_tensors)
        return self.layer_params - unused

    @property
    def num_active_params(self) -> int:
        """Parameters used per token (== num_params for a dense model; Mixtral 8x7B: ~12.9B of 46.7B)."""
        return self.num_params - self.num_layers * (self.layer_params - self.layer_active_params)

    @property
    def num_tensors(self) -> int:
        return (len(self.embedding_tensors) + self.num_layers * len(self.layer_tensors)
                + len(self.final_tensors) + len(self.lm_head_tensors))

    @property
    def largest_tensor(self) -> int:
        return max(self.embedding_tensors + self.layer_tensors + self.final_tensors + self.lm_head_tensors)

    @property
    def attention_width(self) -> int:
        """Width of the query projection output, ``num_heads * head_dim`` (may differ from hidden)."""
        return self.num_heads * self.head_dim

    def eager_keywords(self) -> dict:
        """Keyword arguments of ``timing.eager_elementwise_bytes_per_token`` for this model's layer
        code: ``eager``'s fields, and ``experts_per_token`` for an MoE (0 when dense)."""
        out = {field.name: getattr(self.eager, field.name) for field in dataclasses.fields(EagerLayer)}
        out["experts_per_token"] = self.experts_per_token if self.num_experts > 1 else 0
        return out

    def describe(self) -> str:
        def short(n: int) -> str:
            return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"

        moe = f", {short(self.num_active_params)} active" if self.num_experts > 1 else ""
        return f"{self.name} ({self.family}): {short(self.num_params)} params{moe}"

    @classmethod
    def generic(cls, *, num_layers: int, hidden_size: int, num_heads: int, vocab_size: int,
                ffn_hidden_size: int | None = None, num_kv_heads: int | None = None,
                seq_len: int | None = None, name: str = "generic") -> "ModelSpec":
        """A decoder from its dimensions alone (``--num-layers --hidden-size ...``).

        It is given the Llama architecture (RMSNorm, rotary, SwiGLU, grouped-query attention, no
        biases, untied lm_head): most decoders trained today look like it, and it can be built as a
        real ``LlamaForCausalLM``. Without ``ffn_hidden_size`` the MLP width follows Llama's rule
        (``default_ffn``). Defined here rather than in a family file so that this module imports no
        family: the families import it.
        """
        for key, value in (("num_layers", num_layers), ("hidden_size", hidden_size), ("num_heads", num_heads),
                           ("vocab_size", vocab_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{key}: expected a positive integer, got {value!r}")
        if hidden_size % num_heads:
            raise ValueError(f"num_heads: hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
        cfg = {"model_type": "llama", "hidden_size": hidden_size, "num_hidden_layers": num_layers,
               "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads or num_heads,
               "intermediate_size": ffn_hidden_size or default_ffn(hidden_size), "vocab_size": vocab_size,
               "max_position_embeddings": seq_len or 4096, "tie_word_embeddings": False}
        spec = llama_like(cfg, name=name, family="generic", qkv_bias=False, o_bias=False)
        return spec if seq_len is not None else dataclasses.replace(spec, seq_len=None, hf_config=spec.hf_config)


def default_ffn(hidden_size: int, multiple: int = 256) -> int:
    """Llama's SwiGLU width, ``multiple * ceil((8h/3) / multiple)`` (Touvron et al. 2023): it keeps
    the MLP at ~8h^2 parameters like a GPT ``4h`` MLP."""
    width = int(8 * hidden_size / 3)
    return multiple * ((width + multiple - 1) // multiple)


def first(cfg: dict, *keys: str, default=None):
    """The value of the first key present in an HF config (families renamed keys over time)."""
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def rotary_factor(cfg: dict, *, default: float) -> float:
    """Share of each head that rotary rotates: ``partial_rotary_factor`` (top level or in
    ``rope_parameters``/``rope_scaling``, transformers 5) or GPT-NeoX's older ``rotary_pct``."""
    for section in (cfg, cfg.get("rope_parameters") or {}, cfg.get("rope_scaling") or {}):
        value = first(section, "partial_rotary_factor", "rotary_pct")
        if value is not None:
            return value
    return default


def llama_like(cfg: dict, *, name: str, family: str, qkv_bias: bool, o_bias: bool, mlp_bias: bool = False,
               qk_norm: bool = False, tied_default: bool = False, num_experts: int = 1,
               experts_per_token: int = 1, eager: EagerLayer = EagerLayer()) -> ModelSpec:
    """A spec for any Llama-shaped decoder; the family decides the biases, QK-norm, tying and MoE.

    One layer: RMSNorm, q/k/v/o projections (grouped-query when ``num_key_value_heads`` <
    ``num_attention_heads``; ``head_dim`` may differ from ``hidden / heads``), optional RMSNorms
    over ``head_dim`` on q and k, RMSNorm, SwiGLU MLP (gate, up, down); tensor list as in
    ``transformers/models/llama/modeling_llama.py``. MoE (Mixtral): the MLP becomes a router
    ``hidden x experts`` plus per-expert SwiGLU weights, stored fused by transformers 5 as
    ``gate_up_proj [E, 2f, h]`` and ``down_proj [E, h, f]``.
    """
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv = first(cfg, "num_key_value_heads", default=heads)
    head_dim = first(cfg, "head_dim", default=h // heads)
    ffn = cfg["intermediate_size"]
    vocab = cfg["vocab_size"]
    tied = bool(cfg.get("tie_word_embeddings", tied_default))
    q, k = heads * head_dim, kv * head_dim
    attn = linear(h, q, qkv_bias) + linear(h, k, qkv_bias) + linear(h, k, qkv_bias) + linear(q, h, o_bias)
    if qk_norm:
        attn += norm(head_dim, bias=False) * 2
    if num_experts > 1:
        expert = (2 * ffn * h, h * ffn)
        mlp = linear(h, num_experts, False) + (num_experts * expert[0], num_experts * expert[1])
    else:
        expert = ()
        mlp = linear(h, ffn, mlp_bias) * 2 + linear(ffn, h, mlp_bias)
    layer = norm(h, bias=False) + attn + norm(h, bias=False) + mlp
    return ModelSpec(
        name=name, family=family, num_layers=cfg["num_hidden_layers"], hidden_size=h, num_heads=heads,
        num_kv_heads=kv, head_dim=head_dim, vocab_size=vocab, ffn_hidden_size=ffn,
        seq_len=cfg.get("max_position_embeddings"), tied_embeddings=tied, gated_mlp=True, norm="rmsnorm",
        num_experts=num_experts, experts_per_token=experts_per_token,
        activation=cfg.get("hidden_act", "silu"), dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
        embedding_tensors=(vocab * h,), layer_tensors=layer, expert_tensors=expert,
        final_tensors=norm(h, bias=False), lm_head_tensors=() if tied else linear(h, vocab, False),
        eager=dataclasses.replace(eager, qkv_bias=qkv_bias and not mlp_bias, o_bias=o_bias and not mlp_bias),
        hf_config=dict(cfg),
    )
