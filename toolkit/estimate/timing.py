"""Step time: FLOPs, collective volumes and the pipeline bubble, as small pure functions.

Bandwidths and peaks come from ``dstk.hardware`` (inputs, never constants here).
"""

from __future__ import annotations


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


def dp_traffic_factor(zero_stage: int) -> float:
    """Gradient/parameter traffic per step, in units of one all-reduce of the model (ZeRO paper
    §7: stages 0-2 move ``2 Psi`` per rank, ZeRO-3 ``3 Psi``, i.e. 1.5x)."""
    return 1.5 if zero_stage == 3 else 1.0


def bubble_fraction(*, pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Idle share of the ideal pipeline time, ``(p - 1) / (m v)`` (Narayanan et al. 2021 §2.2)."""
    if pp <= 1:
        return 0.0
    return (pp - 1) / (microbatches * virtual_stages)


def tp_allreduce_bytes_per_layer(*, tokens: int, hidden: int, act_bytes: int, recompute: str) -> float:
    """Bytes all-reduced over the TP group per layer per micro-batch: two all-reduces of
    ``b s h`` in forward, two in backward (Shoeybi et al. 2019 §3, Narayanan et al. 2021 §3.2);
    full recompute repeats the two forward ones. Sequence parallelism turns each into a
    reduce-scatter + all-gather of the same volume (Korthikanti et al. 2022 §4.2.2)."""
    count = 6 if recompute == "full" else 4
    return float(count * tokens * hidden * act_bytes)
