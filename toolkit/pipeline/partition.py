"""Cutting a sequence of pipeline layers into contiguous stages: pure functions, no torch.

A pipeline here is ``[embed, decoder_0 .. decoder_{L-1}, final_norm, head]`` (the head is the
tied embedding on the last stage when the model ties them). Each layer has a parameter count and
estimated per-token forward FLOPs and memory bytes; a method turns those into one weight per layer
and ``split`` finds the contiguous cut that makes the heaviest stage as light as possible.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from dstk.errors import DstkError

METHODS = ("balanced", "parameters", "uniform")

# Bytes per parameter held for training with mixed precision and Adam: 2 (bf16 weight) + 2 (grad)
# + 12 (fp32 master, exp_avg, exp_avg_sq) -- ZeRO paper (Rajbhandari et al. 2020), section 3.1.
TRAIN_BYTES_PER_PARAM = 16


@dataclass(kw_only=True, frozen=True, slots=True)
class LayerCost:
    """One pipeline layer's size and estimated cost per token of a sequence of ``seq_len``."""

    name: str
    """"embed", "layer.3", "norm", "head"."""
    num_params: int
    """Parameters this layer owns (a tied head owns none: its matrix is the embedding's)."""
    flops_per_token: float
    """Forward FLOPs per token."""
    bytes_per_token: float
    """Activation bytes kept for backward per token (bf16)."""


def layer_costs(*, num_params: list[int], names: list[str], hidden_size: int, num_heads: int,
                vocab_size: int, seq_len: int, tied_head: bool) -> list[LayerCost]:
    """Estimated cost of each layer.

    Decoder layer: 2 FLOPs per parameter per token for its matmuls plus 4*T*h for attention
    scores and the weighted sum (Kaplan et al. 2020, table 1); activations 34*h + 5*a*T bytes
    per token (Korthikanti et al. 2022, eq. 2, no recompute). Embedding: a lookup, no FLOPs, h*2
    bytes. Head: 2*V*h FLOPs per token (tied or not); logits kept in fp32, 4*V bytes per token.
    Final norm: about 4*h bytes, negligible FLOPs.
    """
    costs = []
    for name, params in zip(names, num_params, strict=True):
        if name == "embed":
            flops, act = 0.0, 2.0 * hidden_size
        elif name == "head":
            flops, act = 2.0 * vocab_size * hidden_size, 4.0 * vocab_size
        elif name == "norm":
            flops, act = 4.0 * hidden_size, 4.0 * hidden_size
        else:
            flops = 2.0 * params + 4.0 * seq_len * hidden_size
            act = 34.0 * hidden_size + 5.0 * num_heads * seq_len
        costs.append(LayerCost(name=name, num_params=0 if (name == "head" and tied_head) else params,
                               flops_per_token=flops, bytes_per_token=act))
    return costs


def weights_for(costs: list[LayerCost], *, method: str, seq_len: int) -> list[float]:
    """One weight per layer. ``parameters``: parameter count. ``uniform``: 1 per decoder layer
    (the others ride along). ``balanced``: the mean of a layer's share of total compute and its
    share of total memory (parameters x 16 B + activations for one sequence)."""
    if method == "parameters":
        return [float(c.num_params) for c in costs]
    if method == "uniform":
        return [1.0 if c.name.startswith("layer.") else 0.0 for c in costs]
    if method != "balanced":
        raise DstkError(f"unknown partition method {method!r}", hint=f"use one of {', '.join(METHODS)}")
    flops = [c.flops_per_token for c in costs]
    memory = [c.num_params * TRAIN_BYTES_PER_PARAM + c.bytes_per_token * seq_len for c in costs]
    total_flops, total_memory = sum(flops) or 1.0, sum(memory) or 1.0
    return [0.5 * f / total_flops + 0.5 * m / total_memory for f, m in zip(flops, memory)]


def split(weights: list[float], num_stages: int) -> list[int]:
    """Stage boundaries ``[0, b1, ..., len(weights)]`` for contiguous, non-empty stages.

    First the smallest possible heaviest stage ``M``; then, among cuts with no stage above
    ``M``, the one with the smallest sum of squared stage weights, so that the stages that do
    not set the maximum are balanced too (one huge head must not leave 1 layer on one stage and
    5 on the next). Both exact dynamic programmes, O(n^2 * stages).
    """
    n = len(weights)
    if not 1 <= num_stages <= n:
        raise ValueError(f"num_stages: {num_stages} stages for {n} layers")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)

    def solve(cost, combine, limit):
        inf = float("inf")
        best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
        cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
        best[0][0] = 0.0
        for k in range(1, num_stages + 1):
            for i in range(k, n + 1):
                for j in range(k - 1, i):
                    seg = prefix[i] - prefix[j]
                    if seg > limit or best[k - 1][j] == inf:
                        continue
                    value = combine(best[k - 1][j], cost(seg))
                    if value < best[k][i] - 1e-12 * max(1.0, abs(value)):
                        best[k][i], cut[k][i] = value, j
        bounds = [n]
        for k in range(num_stages, 0, -1):
            bounds.append(cut[k][bounds[-1]])
        return best[num_stages][n], bounds[::-1]

    heaviest, bounds = solve(lambda seg: seg, max, float("inf"))
    slack = 1e-9 * max(1.0, abs(heaviest))
    squares, balanced = solve(lambda seg: seg * seg, lambda a, b: a + b, heaviest + slack)
    return balanced if squares != float("inf") else bounds


@dataclass(kw_only=True, frozen=True, slots=True)
class StagePlan:
    """What one stage holds."""

    stage: int
    layer_names: tuple[str, ...]
    num_params: int
    load: float
    """Estimated share of the whole model's cost on this stage (0..1, by the ``balanced``
    weights whatever the method used to cut)."""


def plan_stages(costs: list[LayerCost], *, num_stages: int, method: str, seq_len: int) -> tuple[list[int], list[StagePlan]]:
    """Boundaries and a per-stage report; refuses more stages than decoder layers."""
    num_layers = sum(1 for c in costs if c.name.startswith("layer."))
    if num_stages < 1:
        raise DstkError(f"num_stages must be at least 1, got {num_stages}")
    if num_stages > num_layers:
        raise DstkError(
            f"{num_stages} pipeline stages for a model with {num_layers} decoder layers: "
            "every stage needs at least one decoder layer",
            hint=f"use at most {num_layers} stages",
        )
    weights = weights_for(costs, method=method, seq_len=seq_len)
    if method == "uniform":
        bounds = _uniform_bounds(costs, num_stages)
    else:
        # Cut between decoder layers only: the embedding rides with the first layer and the
        # norm and head with the last, so every stage holds at least one decoder layer.
        layer_at = [i for i, c in enumerate(costs) if c.name.startswith("layer.")]
        starts = [0, *layer_at[1:]]
        ends = [*layer_at[1:], len(costs)]
        units = [sum(weights[lo:hi]) for lo, hi in zip(starts, ends)]
        unit_bounds = split(units, num_stages)
        bounds = [starts[u] for u in unit_bounds[:-1]] + [len(costs)]
    load = weights_for(costs, method="balanced", seq_len=seq_len)
    stages = []
    for s in range(num_stages):
        lo, hi = bounds[s], bounds[s + 1]
        stages.append(StagePlan(stage=s, layer_names=tuple(c.name for c in costs[lo:hi]),
                                num_params=sum(c.num_params for c in costs[lo:hi]), load=sum(load[lo:hi])))
    return bounds, stages


@functools.lru_cache(maxsize=512)
def decoder_layers_per_stage(*, num_layers: int, layer_params: int, embed_params: int, final_params: int,
                             head_params: int, tied_head: bool, hidden_size: int, num_heads: int, vocab_size: int,
                             seq_len: int, num_stages: int, method: str = "balanced") -> tuple[int, ...]:
    """Decoder layers on each stage of the cut ``to_pipeline`` gives DeepSpeed's ``PipelineModule``
    (``plan_stages`` over ``[embed, layer_0 .. layer_{L-1}, norm, head]``, ``head_params`` 0 when
    tied), from parameter counts alone: the estimator prices the stages the engine builds.

    With ``balanced`` (``to_pipeline``'s default) the head's ``2 V h`` FLOPs and ``4 V`` logit bytes
    per token and the embedding's ``16 x`` parameter bytes weigh like layers, so the first and last
    stages take fewer decoder layers when the vocabulary is large, even when ``num_layers`` divides
    by ``num_stages``. Cached: the planner asks for the same model and degree many times."""
    names = ["embed", *(f"layer.{i}" for i in range(num_layers)), "norm", "head"]
    costs = layer_costs(num_params=[embed_params, *([layer_params] * num_layers), final_params, head_params],
                        names=names, hidden_size=hidden_size, num_heads=num_heads, vocab_size=vocab_size,
                        seq_len=seq_len, tied_head=tied_head)
    _, stages = plan_stages(costs, num_stages=num_stages, method=method, seq_len=seq_len)
    return tuple(sum(1 for n in st.layer_names if n.startswith("layer.")) for st in stages)


def _uniform_bounds(costs: list[LayerCost], num_stages: int) -> list[int]:
    """Decoder layers spread as evenly as possible (earlier stages take the remainder), the
    embedding on the first stage, norm and head on the last."""
    layer_at = [i for i, c in enumerate(costs) if c.name.startswith("layer.")]
    per, extra = divmod(len(layer_at), num_stages)
    bounds, taken = [0], 0
    for s in range(num_stages - 1):
        taken += per + (1 if s < extra else 0)
        bounds.append(layer_at[taken - 1] + 1)
    bounds.append(len(costs))
    return bounds


def format_stages(stages: list[StagePlan]) -> str:
    """A small table for people."""
    lines = ["stage  layers                                 params    load"]
    for st in stages:
        names = st.layer_names
        shown = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]} ({len(names)})"
        lines.append(f"{st.stage:>5}  {shown:<29} {st.num_params:>14,}  {st.load:6.1%}")
    return "\n".join(lines)
