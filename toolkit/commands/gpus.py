"""``dstk gpus``: the hardware catalog (GPUs and inter-node networks)."""

from __future__ import annotations

import argparse
import dataclasses
import json

HELP = "list the GPUs and networks the estimator knows (override them with --hardware FILE)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hardware", metavar="FILE", help="YAML/JSON file adding or changing entries")
    parser.add_argument("--format", choices=["human", "json"], default="human")


def run(args: argparse.Namespace) -> int:
    from dstk.hardware import GPUS, INTERCONNECTS, load_catalog

    gpus, nets = load_catalog(args.hardware) if args.hardware else (GPUS, INTERCONNECTS)
    if args.format == "json":
        print(json.dumps({"gpus": [dataclasses.asdict(g) for g in gpus.values()],
                          "interconnects": [dataclasses.asdict(n) for n in nets.values()]}, indent=2))
        return 0
    # fp16 is its own column: a V100 plan runs fp16 at 125 TFLOP/s, which "bf16 -" hid.
    print(f"{'gpu':<11} {'memory':>9} {'bf16 TF':>8} {'fp16 TF':>8} {'fp32 TF':>8} {'link GB/s':>9} "
          f"{'achievable':>10}  name")
    def tf(flops: float) -> str:  # a calibrated CPU rank's 0.43 TFLOP/s read as 0
        return f"{flops / 1e12:.0f}" if flops >= 1e13 else f"{flops / 1e12:.3g}"

    for g in gpus.values():
        bf16 = "-" if g.bf16_flops is None else tf(g.bf16_flops)
        mark = "*" if g != GPUS.get(g.slug) else ""  # from the --hardware file
        print(f"{g.slug + mark:<11} {g.memory_bytes / 2**30:>6.1f} GiB {bf16:>8} {tf(g.fp16_flops):>8} "
              f"{g.fp32_flops / 1e12:>8.{1 if g.fp32_flops >= 1e12 else 3}f} "
              f"{g.intra_node_bytes_per_s / 1e9:>9.{0 if g.intra_node_bytes_per_s >= 1e9 else 2}f} "
              f"{g.achievable_fraction:>10.0%}  "
              f"{g.name}")
    if any(g != GPUS.get(g.slug) for g in gpus.values()):
        print(f"(*: added or changed by {args.hardware}; `dstk plan --hardware {args.hardware}` prices with it)")
    print("(TF: dense peak TFLOP/s; achievable: the share of peak for a model given by --params only; a named "
          "model is priced per operator, its GEMMs on the GPU's measured-efficiency curve)")
    print()
    print(f"{'network':<11} {'GB/s/node':>9} {'latency':>9} {'efficiency':>10}  name")
    for n in nets.values():
        print(f"{n.slug:<11} {n.node_bytes_per_s / 1e9:>9.0f} {n.latency_s * 1e6:>7.0f}us {n.efficiency:>10.0%}  {n.name}")
    return 0
