"""``dstk schema``: print the JSON Schema of DeepSpeed's config that ``dstk validate`` uses."""

from __future__ import annotations

import argparse
import json

HELP = "print the JSON Schema (draft 2020-12) of the DeepSpeed 0.19.8 config"
DESCRIPTION = (
    "Print the JSON Schema that `dstk validate` checks against: every key DeepSpeed 0.19.8 reads, with types, "
    "enums, ranges, defaults and descriptions; unknown keys are errors at every level. Point an editor at it "
    "for completion. --pointer prints one section; --hf-auto lists the keys HF's Trainer fills when \"auto\"."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pointer", metavar="PTR", default="",
                        help="print only this part of the schema, e.g. /properties/zero_optimization")
    parser.add_argument("--hf-auto", action="store_true",
                        help='list the keys transformers\' Trainer fills when they are "auto", and from what')
    parser.add_argument("--format", choices=["json", "text", "human"], default="json",
                        help="for --hf-auto: a table (text) or JSON")


def run(args: argparse.Namespace) -> int:
    from dstk.errors import UsageError
    from dstk.validate.rules import ACCELERATE_FILLS, HF_FILLS
    from dstk.validate.schema import schema_text, subschema

    if args.hf_auto:
        if args.format == "json":
            print(json.dumps({"trainer": HF_FILLS, "accelerate_only": ACCELERATE_FILLS}, indent=2))
        else:
            width = max(map(len, HF_FILLS | ACCELERATE_FILLS))
            for pointer, source in HF_FILLS.items():
                print(f"{pointer:<{width}}  {source}")
            for pointer, source in ACCELERATE_FILLS.items():
                print(f"{pointer:<{width}}  {source} (accelerate only)")
        return 0
    if not args.pointer:
        print(schema_text(), end="")
        return 0
    try:
        node = subschema(args.pointer)
    except (KeyError, TypeError):
        raise UsageError(f"no schema node at {args.pointer}",
                         hint="pointers look like /properties/zero_optimization/properties/stage") from None
    print(json.dumps(node, indent=2))
    return 0
