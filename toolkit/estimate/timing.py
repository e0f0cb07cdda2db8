"""Step time: FLOPs, collective volumes and the pipeline bubble, as small pure functions.

Bandwidths and peaks come from ``dstk.hardware`` (inputs, never constants here).
"""

from __future__ import annotations

import dataclasses


def forward_flops_per_token(*, matmul_params: float, num_layers: int, seq_len: int, attention_width: int) -> float:
    """Forward FLOPs per token: ``2 N`` for the matmul parameters a token passes through (weights
    and lm_head, not the embedding lookup) plus ``4 L s (a d)`` for ``QK^T`` and ``AV`` (Kaplan et
    al. 2020 §2.1; PaLM, Chowdhery et al. 2022, App. B: training ``6N + 12 L H Q T``). Causal
    masking is not subtracted, as in PaLM's and Megatron's MFU accounting."""
    return 2.0 * matmul_params + 4.0 * num_layers * seq_len * attention_width


def attention_forward_flops_per_token(*, num_layers: int, seq_len: int, attention_width: int) -> float:
    """The attention-score part of the forward pass, ``4 L s (a d)``: what selective recompute
    repeats (Korthikanti et al. 2022 §5: hardware FLOPs ``1 + s/(3h)`` vs model ``1 + s/(6h)``)."""
    return 4.0 * num_layers * seq_len * attention_width


FLASH_BACKWARD_RATIO = 2.5
"""A fused attention kernel's backward FLOPs over its forward's: 5 matrix multiplies against 2, the
scores recomputed (Dao 2023 §4.1; Shah et al. 2024 §4.1 count the same)."""


def flash_attention_forward_seconds(*, tokens: float, seq_len: float, q_width: float, peak_flops: float,
                                    fraction: float) -> float:
    """Forward of a fused causal attention kernel (FlashAttention-2, cuDNN) over ``tokens`` tokens of
    ``seq_len``-long sequences with ``q_width = heads x head_dim`` on this GPU: ``QK^T`` and ``PV``
    are ``4 T s q`` FLOPs, of which the kernel runs the unmasked half, ``2 T s q`` (Dao 2023 §4.1
    counts a causal forward as ``4 s^2 d h / 2``; whole blocks above the diagonal are skipped, §3.1.1),
    at ``fraction`` of ``peak_flops`` (``GPU.attention_fraction``: the published causal forward +
    backward rate, FLOPs counted the same way). The backward is ``FLASH_BACKWARD_RATIO`` times this.
    Model FLOPs (MFU) keep the unhalved ``4 T s q``, as PaLM and Megatron count them
    (``forward_flops_per_token``)."""
    return 2.0 * tokens * seq_len * q_width / (peak_flops * fraction)


def training_flops(*, forward: float, attention_forward: float, recompute: str) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) per token: backward costs twice the forward (``3x`` in all);
    full recompute runs the forward again (``4x``, Narayanan et al. 2021 Eq. 3 counts this
    ``96 B s l h^2`` = 4 x 24), selective recompute only the attention scores."""
    model = 3.0 * forward
    if recompute == "full":
        return model, model + forward
    if recompute == "selective":
        return model, model + attention_forward
    return model, model


def ring_allreduce_seconds(*, nbytes: float, ranks: int, bandwidth: float, latency: float = 0.0) -> float:
    """Ring all-reduce: each rank sends and receives ``2 (n - 1)/n * S`` bytes (NCCL
    PERFORMANCE.md, "bus bandwidth"); ``2 (n - 1)`` latency steps."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (ranks - 1) / ranks * nbytes / bandwidth + 2 * (ranks - 1) * latency


def ring_gather_seconds(*, nbytes: float, ranks: int, bandwidth: float, latency: float = 0.0) -> float:
    """Reduce-scatter or all-gather of ``S`` bytes in total: ``(n - 1)/n * S`` per rank."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return (ranks - 1) / ranks * nbytes / bandwidth + (ranks - 1) * latency


def bubble_fraction(*, pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Idle share of the ideal pipeline time, ``(p - 1) / (m v)`` (Narayanan et al. 2021 §2.2)."""
    if pp <= 1:
        return 0.0
    return (pp - 1) / (microbatches * virtual_stages)


def gemm_seconds(*, m: float, n: float, k: float, peak_flops: float, fraction: float, count: float = 1.0) -> float:
    """``count`` matrix multiplies of ``(m x k) @ (k x n)``: ``2 m n k`` FLOPs each at
    ``fraction`` of the dense peak (``GPU.gemm_fraction`` of ``min(m, n, k)``)."""
    return count * 2.0 * m * n * k / (peak_flops * fraction)


def memory_seconds(*, nbytes: float, hbm_bytes_per_s: float | None) -> float:
    """A memory-bound operator (norm, activation, softmax, dropout, residual, optimizer step)
    moves ``nbytes`` through device memory at the sustained HBM bandwidth (roofline: its FLOPs are
    negligible next to its bytes). 0 when the bandwidth is unknown."""
    return nbytes / hbm_bytes_per_s if hbm_bytes_per_s else 0.0


def elementwise_bytes_per_token(*, hidden: int, q_width: int, kv_width: int, ffn: int, act_bytes: int, sp: int,
                                gated: bool, rotary: bool, dropout: bool) -> float:
    """Forward bytes per token of one layer's memory-bound operators on one GPU (widths already
    divided by TP; ``sp`` = TP degree under sequence parallelism, else 1), each operator reading
    its inputs once and writing its output once, as Megatron's fused kernels do (Korthikanti et al.
    2022 §4.2.2 for what sequence parallelism shards):

    - two norms, ``2 w h`` each, and two residual adds (with bias-dropout: ``(3w + 1) h`` with
      the 1-byte mask, else ``3 w h``), over ``h / sp`` per token;
    - the MLP activation: ``2 w f`` (GELU), ``3 w f`` (gated: gate and up in, product out);
    - rotary embedding of q and k: ``2 w (q + kv)``.
    """
    w = act_bytes
    replicated = 2 * 2 * w * hidden + 2 * (3 * w + (1 if dropout else 0)) * hidden
    out = replicated / sp + (3 if gated else 2) * w * ffn
    if rotary:
        out += 2 * w * (q_width + kv_width)
    return float(out)


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class EagerBytes:
    """Bytes per token of one layer's memory-bound operators, forward and backward."""

    forward: float
    backward: float


# (forward, backward) bytes per element of the MLP activation in units of the activation width
# ``w``, as HF transformers runs it (``transformers/activations.py``): ``gelu_new``
# (``NewGELUActivation``) is ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` written as eight
# aten ops (pow, mul, add, mul, tanh, add, mul, mul: 18 w) whose autograd backward runs eleven
# (28 w); silu, gelu, gelu_pytorch_tanh and relu are one aten kernel each way (read x, write y:
# 2 w; read dy and x, write dx: 3 w).
# BLOOM's ``bloom_gelu`` (``GeLUFunction``) writes the same tanh formula as nine ops (three
# scalar products 2 w, three tensor products 3 w, two scalar adds 2 w, tanh 2 w: 21 w) and its
# hand-written backward recomputes tanh and the derivative in 17 more (44 w).
_EAGER_ACTIVATION = {"gelu_new": (18, 28), "bloom_gelu": (21, 44)}


def eager_elementwise_bytes_per_token(*, hidden: int, q_width: float, kv_width: float, ffn: float, head_dim: int,
                                      act_bytes: int, sp: int = 1, norm: str, activation: str, gated: bool,
                                      rotary: bool, dropout: bool, bias: bool = False, fused_qkv: bool = False,
                                      qk_norm: bool = False, norm_weight_fp32: bool = False, qkv_bias: bool = False,
                                      o_bias: bool = False, qkv_split: str = "split", fused_gate_up: bool = False,
                                      rotary_fraction: float = 1.0, rotary_cat: bool = False, q_scale: bool = False,
                                      experts_per_token: int = 0, num_norms: int = 2,
                                      heads_reshaped: bool = False, kv_repeated: bool = False) -> EagerBytes:
    """Bytes per token of one layer's non-GEMM, non-attention operators as HF transformers' modeling
    code runs them eagerly (the ``deepspeed`` engine), counted aten op by aten op from the installed
    transformers 5.x code (``LlamaRMSNorm``, ``apply_rotary_pos_emb``/``rotate_half``,
    ``LlamaMLP``, ``GPT2Block``/``GPT2MLP``, ``NewGELUActivation``; ``GemmaRMSNorm``,
    ``Phi3Attention``/``Phi3MLP``, ``GPTNeoXAttention``, ``OPTAttention``, ``MixtralSparseMoeBlock``
    with ``integrations.moe.grouped_mm_experts_forward``; ``FalconAttention`` as transformers 5.25
    rewrote it, Llama-style) and its autograd backward, each op
    reading its inputs and writing its output (``benchmarks/eager_bytes.py`` measures the same
    under a ``TorchDispatchMode``). Widths already divided by TP (``sp``: the TP degree under
    sequence parallelism, else 1); ``w`` = ``act_bytes``, fp32 intermediates 4 bytes; ``c = w + 4``
    per fp32 cast (none in fp32 training). Per element of the width named:

    - RMSNorm (``hidden.to(fp32)``, ``pow(2)``, ``mean``, ``* rsqrt``, ``.to(w)``, ``weight *``):
      forward ``2c + 20 + 2w``; backward ``2c + 68 + 6w`` (weight gradient ``3w + w``, the fp32
      chain ``pow``/``mean``/``rsqrt``/``mul`` reversed). ``norm_weight_fp32`` (Gemma's
      ``output * (1 + weight.float())`` before the cast back): the weight product in fp32,
      ``8`` forward and ``24`` backward instead of ``2w`` and ``6w``. LayerNorm (one
      ``native_layer_norm`` kernel): forward ``2w``, backward ``3w``. ``num_norms`` per layer over
      ``h`` (two; Falcon-7B's parallel block one), QK-norm (Qwen3) over ``q + kv``.
    - Residual adds, two: ``3w h`` each way (a parallel residual, GPT-NeoX/Falcon, adds as many).
      In backward the input gradients of projections that share an input add up: ``3w h`` per
      extra consumer (q/k/v separate: 2; gate and up: 1; MoE router and experts: 1). A fused QKV
      projection instead joins its three gradients: ``qkv_split="split"`` (GPT-2's ``.split``,
      Falcon-7B's multi-query ``.split([heads, 1, 1], dim=-2)``: one ``cat``, ``2w (q + 2kv)``),
      ``"unbind"`` (classic Falcon's ``unflatten(-2, (heads, 3)).unbind(-2)``: one ``stack``, the
      same ``2w (q + 2kv)``), ``"view"`` (GPT-NeoX's per-head ``view`` + ``chunk``: ``cat``
      and the ``clone`` back to token-major, ``4w (q + 2kv)``), ``"slice"`` (Phi-3's slices,
      three ``slice_backward`` over the whole width and two adds, ``11w (q + 2kv)``), ``"select"``
      (BLOOM's per-head ``view`` + ``select``: the same with ``select_backward``),
      ``"group_select"`` (Falcon's new decoder: a per-KV-group ``view``; q is
      ``grouped[..., :-2, :].flatten(-3, -2)``, copied ``2w q`` forward, k and v two ``select``s;
      backward as ``"select"``: two ``select_backward``, the q ``slice_backward``, two adds). ``cat``,
      ``stack`` and the zero-fill copies take the strided q/k gradients, so no rotary ``clone``
      under any of them but ``"slice"``. ``kv_repeated`` (transformers' ``repeat_kv`` before SDPA,
      run when SDPA is handed a mask: Falcon 5.25 always builds one, ``allow_is_causal_skip=False``):
      k and v expanded to every query head, copied by the ``reshape`` ``2w (q + kv)`` forward (none
      with one KV head, ``kv = head_dim``: the reshape is a view), backward the expand's ``sum``
      ``2w (q + kv)``. A fused
      ``gate_up_proj`` (``fused_gate_up``, Phi-3) concatenates instead of adding: ``4w f``.
    - Residual dropout, two (CUDA's fused ``native_dropout``: x in, y and a 1-byte mask out):
      ``(2w + 1) h`` forward, ``(2w + 1) h`` backward (gradient and mask in, gradient out).
    - Rotary on the rotated part ``R = rotary_fraction (q + kv)`` of q and k (``q * cos +
      rotate_half(q) * sin``: mul, neg, cat, mul, add): forward ``10w R``; backward ``15w R``: mul,
      neg, two ``slice_backward`` (zero-fill, then copy the half: ``2w`` each), add, mul, add;
      plus the ``clone`` that makes the q and k gradients contiguous for the projection's ``view``
      (``2w (q + kv)``; for a fused QKV only under ``qkv_split="slice"``, the join above); plus
      ``w head_dim`` per ``cos``/``sin`` read (four each way). ``rotary_cat`` (GPT-NeoX, Phi-3:
      ``cat((q_rot, q_pass))``, even when the pass part is empty): forward the ``cat``
      ``2w (q + kv)`` and the attention output's ``clone`` ``2w q`` (its layout follows the
      concatenated q); backward two ``slice_backward`` (``w (q + kv) + 2w`` per copied element; the
      rotated one is skipped when R is the whole width) and their ``add`` ``3w (q + kv)``.
    - ``q_scale`` (OPT's ``q_proj(x) * scaling``): ``2w q`` each way.
    - ``heads_reshaped`` (BLOOM's eager ``baddbmm`` attention): q, k, v reshaped to
      ``(batch x heads, s, d)`` and the output merged back, copies ``2w (q + 2kv) + 2w q`` forward;
      backward the ``alpha`` scaling of both score-GEMM input gradients ``2w (q + kv)`` and the k
      gradient's copy ``2w kv``. Its scores (mask add, fp32 softmax) are attention's.
    - MLP activation over ``f``: gated ``act(gate) * up``: activation plus ``3w`` forward,
      activation backward plus two products ``6w``; ``_EAGER_ACTIVATION`` for the activation.
    - MoE (``experts_per_token`` = k > 0; ``ffn`` = k x the expert width; transformers'
      default ``grouped_mm`` experts, whose cost does not depend on how the tokens are routed):
      the gathered copies ``2k w h`` forward (each row read and written k times); the routing-weight
      product promotes to fp32 (``(w + 4) k h``), the inverse permutation (``index``, ``8 k h``),
      the sum over k (``(4k + 4) h``) and the cast back (``(4 + w) h``). Backward: the cast
      ``(4 + w) h``, the sum's expanded ``clone`` ``(4 + 4k) h`` (none for k = 1), the permutation's ``new_zeros``
      + ``index_put`` ``16 k h``, the weight product's input gradient ``8 k h`` and its cast
      ``(4 + w) k h``, the routing-weight gradient ``(12 + w) k h``, the ``chunk`` of
      ``gate_up_proj`` ``4w f``, the gather's ``new_zeros`` + ``index_put`` ``(3 + k) w h``, and the
      router/experts input-gradient add ``3w h``. The router's softmax/topk/sort over the experts
      (tens of bytes per token) is not counted.
    - Bias gradients (``bias``): a ``sum`` over the tokens reading ``w`` per output element of
      the four projections (and the MLP's); ``qkv_bias`` (Qwen2) over ``q + 2kv`` alone, ``o_bias``
      over ``h``.

    Not counted: the GEMMs (priced by FLOPs), the attention kernel (SDPA/flash, priced
    separately), views, the ``cos``/``sin`` tables (once per model), the router's own ops."""
    w, f32 = act_bytes, 4
    c = (w + f32) if w < f32 else 0
    h = hidden / sp
    qk = q_width + kv_width
    qkv = q_width + 2 * kv_width
    if norm == "rmsnorm":
        weight_fwd, weight_bwd = (2 * f32, 6 * f32) if norm_weight_fp32 else (2 * w, 6 * w)
        norm_fwd, norm_bwd = 2 * c + 20 + weight_fwd, 2 * c + 68 + weight_bwd
    else:
        norm_fwd, norm_bwd = 2 * w, 3 * w
    act_fwd, act_bwd = _EAGER_ACTIVATION.get(activation, (2, 3))
    forward = num_norms * norm_fwd * h + 2 * 3 * w * h
    backward = num_norms * norm_bwd * h + 2 * 3 * w * h
    if qk_norm:
        forward += norm_fwd * qk
        backward += norm_bwd * qk
    if fused_qkv:
        join = {"split": 2, "unbind": 2, "view": 4, "slice": 11, "select": 11, "group_select": 11}[qkv_split]
        backward += join * w * qkv
        if qkv_split == "group_select":
            forward += 2 * w * q_width
    else:
        backward += 2 * 3 * w * h
    if dropout:
        forward += 2 * (2 * w + 1) * h
        backward += 2 * (2 * w + 1) * h
    if kv_repeated and kv_width < q_width:
        forward += 2 * w * (q_width + kv_width) if kv_width > head_dim else 0
        backward += 2 * w * (q_width + kv_width)
    if rotary:
        rotated = rotary_fraction * qk
        forward += 10 * w * rotated + 4 * w * head_dim * rotary_fraction
        backward += 15 * w * rotated + 4 * w * head_dim * rotary_fraction
        if not fused_qkv or qkv_split == "slice":
            backward += 2 * w * qk
        if rotary_cat:
            forward += 2 * w * qk + 2 * w * q_width
            backward += w * qk + 2 * w * (qk - rotated) + 3 * w * qk
            if rotated < qk:
                backward += w * qk + 2 * w * rotated
    if q_scale:
        forward += 2 * w * q_width
        backward += 2 * w * q_width
    if heads_reshaped:
        forward += 2 * w * qkv + 2 * w * q_width
        backward += 2 * w * (q_width + kv_width) + 2 * w * kv_width
    if gated:
        forward += (act_fwd + 3) * w * ffn
        backward += (act_bwd + 6) * w * ffn
        backward += 4 * w * ffn if (fused_gate_up or experts_per_token) else 0
        backward += 3 * w * h if not fused_gate_up else 0
    else:
        forward += act_fwd * w * ffn
        backward += act_bwd * w * ffn
    if experts_per_token:
        k = experts_per_token
        forward += 2 * k * w * h + (w + f32) * k * h + 8 * k * h + (4 * k + 4) * h + (f32 + w) * h
        backward += ((f32 + w) * h + ((4 + 4 * k) * h if k > 1 else 0) + 16 * k * h + 8 * k * h
                     + (f32 + w) * k * h + (12 + w) * k * h + (3 + k) * w * h)
    if bias:
        backward += w * (qkv + 2 * hidden + (2 if gated else 1) * ffn)
    else:
        backward += w * (qkv * qkv_bias + hidden * o_bias)
    return EagerBytes(forward=float(forward), backward=float(backward))


def softmax_bytes_per_score(*, act_bytes: int, dropout: bool) -> float:
    """Forward bytes per attention score of eager attention: the fused scale-mask-softmax reads
    the scores and writes the probabilities (``2w``); attention dropout reads and writes them again
    and writes a 1-byte mask (``2w + 1``) (Korthikanti et al. 2022 Table 2 counts the same tensors
    for memory)."""
    return 2.0 * act_bytes + ((2.0 * act_bytes + 1.0) if dropout else 0.0)


def optimizer_step_bytes_per_param(*, optimizer: str, precision: str) -> float:
    """HBM bytes per parameter of one optimizer step on the GPU, counted kernel by kernel as
    Megatron-LM and DeepSpeed run it with fp32 master weights (multi-tensor apply, fused Adam):
    fp16 unscales the gradients and checks them for inf/nan (read and write 4); the gradient norm
    reads them (4); Adam reads master, ``m``, ``v`` and the gradient and writes the first three
    (28); the master is copied to the 16-bit parameter (read 4, write 2); the gradient buffer is
    zeroed (write 4). One-state optimizers (SGD with momentum, Lion) move 8 less, Adafactor's
    factored state about as little. fp32 training has no master copy (-6)."""
    states = {"adamw": 2, "adam": 2, "sgd": 1, "lion": 1, "adafactor": 1}.get(optimizer, 2)
    update = 4 * (2 + states) + 4 * (1 + states)
    out = 4.0 + update + 4.0
    if precision == "fp16":
        out += 8.0
    if precision != "fp32":
        out += 6.0
    return out


def grad_accumulation_bytes_per_param(*, engine: str, precision: str) -> float:
    """HBM bytes per parameter that every micro-batch's backward spends landing the weight
    gradients where the optimizer reads them, on top of the weight-gradient GEMMs: Megatron
    accumulates them into the contiguous fp32 ``main_grad`` buffer (read and write 4 bytes, fused
    into the weight-gradient GEMM by ``gradient_accumulation_fusion``, Megatron-LM 83b1e42f30 of
    2022-02-13; before it a separate ``main_grad.add_``, about as many bytes); DeepSpeed
    copies each 16-bit ``.grad`` into its contiguous reduce bucket (read and write ``w``;
    ``contiguous_gradients``, ZeRO-2/3) or accumulates it into ``.grad`` (ZeRO-0/1)."""
    if engine == "megatron":
        return 8.0
    return 2.0 * (4 if precision == "fp32" else 2)
