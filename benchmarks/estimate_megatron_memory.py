"""The Megatron-engine memory model against Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", arXiv 2205.05198), Figures 1 and 7: GPT models, TP 8,
sequence 2048, vocabulary 51200, fp16, no data parallelism, the paper's Table 3 configurations.

    .venv/bin/python benchmarks/estimate_megatron_memory.py

Figure 1 gives, per GPU, the parameter + optimizer memory and the activation memory of the TP
baseline (no recompute, no sequence parallelism) and of "present work" (sequence parallelism +
selective recompute); Figure 7 the activation memory of five variants relative to the baseline.
The bar heights are as calculon transcribes them in its validation
(calculon-ai/calculon, ``calculon/llm/validation.py``, ``seqsel_fig1`` / ``seqsel_fig7``, GiB and
percent); its execution files (``validation/seqsel/fig1/*.json``) give the pipeline interleaving
the figure assumes: 3 chunks for 175B and 530B, none for 22B and 1T. The figure's bars equal the
paper's own formulas: parameters + optimizer = 18 bytes x 12Lh^2/(tp) (the transformer layers
only, no embedding), activations = Table 2 x L (the first stage's Eq. 5, no embedding terms).

What dstk is compared on, per row:
- **states**: a pipeline stage that holds only transformer layers (a middle stage), the quantity
  the figure draws; dstk's first stage, with the vocabulary-parallel embedding and learned
  positions the figure leaves out, is printed beside it ("1st stage"), and it is what the plan's
  fit check uses. For 22B (one stage) the only stage, embedding included.
- **activations**: the first stage (p micro-batches in flight, interleaving factor), which
  is where the figure's number lives, including dstk's embedding/output terms.
- **peak**: dstk's per-GPU total (fullest stage, CUDA/NCCL overhead and Megatron's buffers
  included) against an 80 GiB A100.
- **HF acct**: the first stage's activations as the DeepSpeed path prices HF modules
  (``engine="deepspeed"``), over the published figure: what the Megatron engine got before.
"""

from __future__ import annotations

from dstk.estimate import estimate
from dstk.estimate import megatron as meg
from dstk.estimate.memory import LayerShape, in_flight_microbatches
from dstk.hardware import Cluster, get_gpu, get_interconnect
from dstk.layout import Layout, Training
from dstk.models import family_module

GiB = 2**30

# name: (heads, hidden, layers, pp, gpus, global batch, micro-batch, interleaved chunks): Table 3,
# interleaving from calculon's validation/seqsel/fig1 execution files.
MODELS = {
    "22B": (64, 6144, 48, 1, 8, 4, 4, 1),
    "175B": (96, 12288, 96, 8, 64, 64, 1, 3),
    "530B": (128, 20480, 105, 35, 280, 280, 1, 3),
    "1T": (160, 25600, 128, 64, 512, 512, 1, 1),
}

# Figure 1, GiB per GPU: (parameters + optimizer, activations baseline, activations SP + selective).
FIGURE1 = {
    "22B": (45.5625, 59.25, 9.5625),
    "175B": (45.5625, 66.84375, 12.3515625),
    "530B": (31.640625, 114.0234375, 23.076171875),
    "1T": (32.958984375, 131.25, 26.5625),
}

# Figure 7, activation memory in % of the TP baseline: sequence parallel, selective recompute,
# both, full recompute.
FIGURE7 = {
    "22B": (66.84, 49.42, 16.18, 7.64),
    "175B": (62.04, 56.53, 18.49, 8.71),
    "530B": (58.31, 62.04, 20.27, 9.42),
    "1T": (58.31, 62.04, 20.27, 9.42),
}
VARIANTS = {"baseline": ("none", False), "SP": ("none", True), "selective": ("selective", False),
            "SP + selective": ("selective", True), "full": ("full", False)}


def gpt(heads: int, hidden: int, layers: int):
    """A GPT-3-style decoder (learned positions, 4h GELU MLP, LayerNorm, dropout 0.1, tied
    embedding), as in the paper."""
    cfg = {"model_type": "gpt2", "n_embd": hidden, "n_layer": layers, "n_head": heads, "vocab_size": 51200,
           "n_positions": 2048, "attn_pdrop": 0.1}
    return family_module("gpt2").read(cfg, name=f"gpt-{hidden}")


def run(name: str, variant: str, engine: str = "megatron"):
    """dstk's estimate of one Figure 1/7 configuration on the Megatron engine (eager attention =
    Megatron's core attention with materialised scores, as in the paper)."""
    heads, hidden, layers, pp, gpus, batch, micro, v = MODELS[name]
    recompute, sp = VARIANTS[variant]
    cluster = Cluster(num_nodes=max(1, gpus // 8), gpus_per_node=min(8, gpus), gpu=get_gpu("a100-80gb"),
                      interconnect=get_interconnect("ib-hdr"))
    training = Training(seq_len=2048, global_batch=batch, precision="fp16", attention="eager")
    layout = Layout(dp=1, tp=8, pp=pp, micro_batch=micro, grad_accum=batch // micro, recompute=recompute,
                    sequence_parallel=sp, virtual_stages=v)
    return estimate(model=gpt(heads, hidden, layers), layout=layout, training=training, cluster=cluster,
                    engine=engine)


def figure1_rows():
    """(model, variant, published states, dstk states, dstk first-stage states, published
    activations, dstk activations, dstk per-GPU peak, activations priced as HF modules on the
    DeepSpeed engine), GiB."""
    rows = []
    for name, (states, act_base, act_seqsel) in FIGURE1.items():
        for variant, published_act in (("baseline", act_base), ("SP + selective", act_seqsel)):
            mem = run(name, variant).memory
            first = mem.per_stage[0]
            layers_only = mem.per_stage[len(mem.per_stage) // 2]
            hf = run(name, variant, engine="deepspeed").memory.per_stage[0].activations_bytes
            rows.append((name, variant, states, layers_only.model_states_bytes / GiB, first.model_states_bytes / GiB,
                         published_act, first.activations_bytes / GiB, mem.per_gpu.total_bytes / GiB, hf / GiB))
    return rows


def first_stage_activations(name: str, variant: str) -> tuple[float, float]:
    """(transformer layers only, whole stage) first-stage activation bytes stored between forward
    and backward. Figure 7 draws the layers (Korthikanti's Eq. 5 without the §4.3 embedding and
    output terms); the stage adds those, which matter only next to full recompute's small
    checkpoints. Neither counts the one layer full recompute re-materialises inside backward
    (part of dstk's peak, not of the figure)."""
    heads, hidden, layers, pp, gpus, batch, micro, v = MODELS[name]
    recompute, sp = VARIANTS[variant]
    stage = run(name, variant).memory.per_stage[0]
    shape = LayerShape(hidden=hidden, q_width=hidden // 8, kv_width=hidden // 8, ffn=4 * hidden // 8,
                       heads=heads // 8, dropout=True)
    terms = meg.activation_terms(shape=shape, gated=False, tokens=micro * 2048, seq_len=2048, vocab=51200,
                                 act_bytes=2, attention="eager", recompute=recompute, tp=8,
                                 sequence_parallel_tp=8 if sp else 1)
    held = in_flight_microbatches(pp=pp, stage=0, grad_accum=batch // micro, virtual_stages=v)
    return stage.num_layers * terms.layer_bytes * held, stage.activations_bytes - terms.recompute_layer_bytes


def main() -> None:
    print("Korthikanti et al. 2022 Figure 1 (GiB per GPU, A100-80GB, TP 8) vs dstk --engine megatron")
    print(f"{'model':<5} {'variant':<15} {'states pub':>10} {'dstk':>7} {'err':>6} {'1st stage':>9} "
          f"{'act pub':>8} {'dstk':>7} {'err':>6} {'peak':>6} {'HF acct':>8}")
    errors = []
    for name, variant, s_pub, s_dstk, s_first, a_pub, a_dstk, peak, hf in figure1_rows():
        es, ea = s_dstk / s_pub - 1, a_dstk / a_pub - 1
        errors += [abs(es), abs(ea)]
        print(f"{name:<5} {variant:<15} {s_pub:>10.2f} {s_dstk:>7.2f} {es:>+6.1%} {s_first:>9.2f} "
              f"{a_pub:>8.2f} {a_dstk:>7.2f} {ea:>+6.1%} {peak:>6.1f} {hf / a_pub:>7.2f}x")
    print(f"Figure 1: mean absolute error {sum(errors) / len(errors):.1%}, worst {max(errors):.1%} "
          f"({len(errors)} bars)")
    print()
    print("Figure 7 (first-stage stored activations, % of the TP baseline): published, dstk layers, dstk stage")
    names = list(VARIANTS)[1:]
    print(f"{'model':<5} " + " ".join(f"{n:>22}" for n in names))
    errors, stage_errors = [], []
    for name, published in FIGURE7.items():
        base_layers, base_stage = first_stage_activations(name, "baseline")
        cells = []
        for variant, pub in zip(names, published):
            layers, stage = first_stage_activations(name, variant)
            rel, rel_stage = 100 * layers / base_layers, 100 * stage / base_stage
            errors.append(abs(rel / pub - 1))
            stage_errors.append(abs(rel_stage / pub - 1))
            cells.append(f"{pub:>8.2f} {rel:>6.2f} {rel_stage:>6.2f}")
        print(f"{name:<5} " + " ".join(cells))
    print(f"Figure 7, layers: mean absolute error {sum(errors) / len(errors):.1%}, worst {max(errors):.1%}; "
          f"whole stage: mean {sum(stage_errors) / len(stage_errors):.1%}, worst {max(stage_errors):.1%} "
          f"({len(errors)} bars)")


if __name__ == "__main__":
    main()
