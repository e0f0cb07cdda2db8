"""``dstk models``: the model presets."""

from __future__ import annotations

import argparse
import difflib
import json

HELP = "list the model presets (families, sizes, parameter counts)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--family", help="only this family (HF model_type, e.g. llama)")
    parser.add_argument("--format", choices=["human", "json"], default="human")


def run(args: argparse.Namespace) -> int:
    from dstk.errors import UsageError
    from dstk.models import FAMILIES, list_models

    family = None if args.family is None else args.family.strip().lower()  # `--family Mixtral` is mixtral
    specs = [s for s in list_models() if family in (None, s.family)]
    if not specs:
        similar = [f for f in FAMILIES if f.startswith(family) or family.startswith(f)] or \
            difflib.get_close_matches(family, FAMILIES, n=2)
        hint = f"did you mean {' or '.join(similar)}? " if similar else ""
        raise UsageError(f"--family {args.family}: no such family", hint=f"{hint}families: {', '.join(FAMILIES)}")
    rows = [{"name": s.name, "family": s.family, "num_params": s.num_params, "num_active_params": s.num_active_params,
             "num_layers": s.num_layers, "hidden_size": s.hidden_size, "num_heads": s.num_heads,
             "num_kv_heads": s.num_kv_heads, "ffn_hidden_size": s.ffn_hidden_size, "vocab_size": s.vocab_size,
             "seq_len": s.seq_len, "tied_embeddings": s.tied_embeddings} for s in specs]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'name':<18} {'family':<9} {'params':>9} {'layers':>6} {'hidden':>6} {'heads':>7} {'ffn':>6} {'vocab':>7}")
    for r in rows:
        size = f"{r['num_params'] / 1e9:.2f}B" if r["num_params"] >= 1e9 else f"{r['num_params'] / 1e6:.0f}M"
        heads = f"{r['num_heads']}/{r['num_kv_heads']}"
        print(f"{r['name']:<18} {r['family']:<9} {size:>9} {r['num_layers']:>6} {r['hidden_size']:>6} {heads:>7} "
              f"{r['ffn_hidden_size']:>6} {r['vocab_size']:>7}")
    moe = [(r, s) for r, s in zip(rows, specs) if s.num_experts > 1]
    for r, s in moe:  # what a token computes (FLOPs, MFU) is the active count, not the total above
        print(f"  {r['name']}: {r['num_active_params'] / 1e9:.2f}B active per token ({s.experts_per_token} of "
              f"{s.num_experts} experts); ffn is one expert's width")
    return 0
