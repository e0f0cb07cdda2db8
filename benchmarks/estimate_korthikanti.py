"""The time model against published iteration times: Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models"), Table 5, GPT models on Selene (A100-80GB SXM, 8 per
node, 8 x HDR InfiniBand), TP = 8, sequence 2048, vocabulary 51200, no data parallelism.

    .venv/bin/python benchmarks/estimate_korthikanti.py

Prints the predicted and the measured seconds per iteration with full recompute and with
sequence parallelism + selective recompute ("present work"), and the error per row. The model
configurations are the paper's Table 3.
"""

from __future__ import annotations

from dstk.estimate import estimate
from dstk.hardware import Cluster, get_gpu, get_interconnect
from dstk.layout import Layout, Training
from dstk.models import family_module

# name: (heads, hidden, layers, pp, gpus, global batch, micro-batch), Table 3
MODELS = {
    "22B": (64, 6144, 48, 1, 8, 4, 4),
    "175B": (96, 12288, 96, 8, 64, 64, 1),
    "530B": (128, 20480, 105, 35, 280, 280, 1),
    "1T": (160, 25600, 128, 64, 512, 512, 1),
}
MEASURED = {"22B": (1.42, 1.10), "175B": (18.13, 13.75), "530B": (49.05, 37.83), "1T": (94.42, 71.49)}  # Table 5


def gpt(heads: int, hidden: int, layers: int):
    """A GPT-3-style decoder (learned positions, 4h GELU MLP, LayerNorm), as in the paper."""
    cfg = {"model_type": "gpt2", "n_embd": hidden, "n_layer": layers, "n_head": heads, "vocab_size": 51200,
           "n_positions": 2048, "attn_pdrop": 0.1}
    return family_module("gpt2").read(cfg, name=f"gpt-{hidden}")


def main() -> None:
    gpu = get_gpu("a100-80gb")
    net = get_interconnect("ib-hdr")
    print(f"{'model':<6} {'recompute':<22} {'predicted s':>11} {'measured s':>10} {'error':>7} {'MFU':>6}")
    errors = []
    for name, (heads, hidden, layers, pp, gpus, batch, micro) in MODELS.items():
        spec = gpt(heads, hidden, layers)
        cluster = Cluster(num_nodes=max(1, gpus // 8), gpus_per_node=min(8, gpus), gpu=gpu, interconnect=net)
        training = Training(seq_len=2048, global_batch=batch, precision="fp16")
        for (label, recompute, sp), measured in zip((("full", "full", False), ("selective + SP", "selective", True)),
                                                    MEASURED[name]):
            layout = Layout(dp=1, tp=8, pp=pp, micro_batch=micro, grad_accum=batch // micro, recompute=recompute,
                            sequence_parallel=sp)
            t = estimate(model=spec, layout=layout, training=training, cluster=cluster).time
            err = t.step_seconds / measured - 1
            errors.append(abs(err))
            print(f"{name:<6} {label:<22} {t.step_seconds:>11.2f} {measured:>10.2f} {err:>+7.1%} {t.mfu:>6.1%}")
    print(f"mean absolute error {sum(errors) / len(errors):.1%}, worst {max(errors):.1%}")


if __name__ == "__main__":
    main()
