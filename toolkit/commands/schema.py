"""``dstk schema``: print the JSON Schema of DeepSpeed's config that ``dstk validate`` uses, or (``--intent``)
the JSON Schema of the intent YAML that ``dstk plan`` reads."""

from __future__ import annotations

import argparse
import dataclasses
import json

HELP = "print the JSON Schema (draft 2020-12) of a DeepSpeed release's config (0.14-0.19), or of the intent (--intent)"
DESCRIPTION = (
    "Print the JSON Schema that `dstk validate` checks against: every key one DeepSpeed release reads, with "
    "types, enums, ranges, defaults and descriptions; unknown keys are errors at every level. --deepspeed-version "
    "picks the release (0.14 to 0.19; default as for validate: [tool.dstk] deepspeed_version, the installed "
    "deepspeed, a pin in requirements*.txt/pyproject.toml above the working directory, else the newest; the "
    "choice is said on stderr). Save it (`dstk schema > deepspeed.schema.json`) and point an editor at it "
    "for completion. --pointer prints one section; --hf-auto lists the keys HF's Trainer fills when \"auto\". "
    "--intent prints the schema of the intent YAML instead (sections, fields, types, choices, defaults), derived "
    "from the intent's dataclasses: point an editor's YAML support at it to check intent files as you type."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--intent", action="store_true",
                        help="the JSON Schema of the intent YAML (plan/generate/explain input) instead")
    parser.add_argument("--deepspeed-version", metavar="X",
                        help="the DeepSpeed release (0.14 or 0.14.5: the nearest shipped minor, 0.14-0.19)")
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

    if args.intent:
        if args.hf_auto:
            raise UsageError("--intent and --hf-auto: pick one", hint="--hf-auto is about DeepSpeed configs")
        node = intent_schema()
        if args.pointer:
            try:
                for part in args.pointer.strip("/").split("/"):
                    node = node[part.replace("~1", "/").replace("~0", "~")]
            except (KeyError, TypeError):
                raise UsageError(f"no intent schema node at {args.pointer}",
                                 hint="pointers look like /properties/training/properties/seq_len") from None
        print(json.dumps(node, indent=2))
        return 0
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
    minor = _minor(args.deepspeed_version)
    if not args.pointer:
        print(schema_text(minor), end="")
        return 0
    try:
        node = subschema(args.pointer, minor=minor)
    except (KeyError, TypeError):
        raise UsageError(f"no schema node at {args.pointer}",
                         hint="pointers look like /properties/zero_optimization/properties/stage") from None
    print(json.dumps(node, indent=2))
    return 0


def _minor(flag: str | None) -> str:
    """The shipped minor to print (``dstk.validate.versions.select``, as validate picks it for a file in the
    working directory); the choice goes to stderr so that stdout stays the schema."""
    import os
    import sys

    from dstk.errors import UsageError
    from dstk.validate.project import settings_for
    from dstk.validate.versions import select

    here = os.path.join(os.getcwd(), "ds_config.json")
    project = settings_for(here) if flag is None else None
    try:
        selection = select(flag=flag, project_version=project.deepspeed_version if project else None,
                           project_source=project.source if project else None, config_path=here)
    except ValueError as exc:
        raise UsageError(str(exc), hint="e.g. --deepspeed-version 0.14 (shipped: 0.14 to 0.19)") from None
    print(f"dstk schema: {selection.reason}", file=sys.stderr)
    return selection.minor


_NUMBER_TEXT = r"^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$"
"""A number PyYAML leaves as a string: YAML 1.1 needs a dot in a float (``3e-4`` is text to PyYAML, a
number to YAML 1.2 editors), and dstk's loader converts such text (``dstk.intent._coerce``)."""


def _choices() -> dict[tuple[str, str], tuple]:
    """The fields whose values are checked against a fixed set in the intent's ``__post_init__``
    (``_choice`` calls): the same constants, so the schema and the loader cannot disagree."""
    from dstk.intent import ENGINES, SCHEDULES
    from dstk.layout import ATTENTIONS, OFFLOADS, OPTIMIZERS, PRECISIONS, RECOMPUTES

    return {("training", "precision"): PRECISIONS, ("training", "optimizer"): OPTIMIZERS,
            ("training", "attention"): ATTENTIONS, ("training", "schedule"): SCHEDULES,
            ("constraints", "engine"): ENGINES, ("constraints", "recompute"): RECOMPUTES,
            ("constraints", "offload_optimizer"): OFFLOADS, ("constraints", "offload_params"): OFFLOADS,
            ("constraints", "zero_stage"): (0, 1, 2, 3), ("training", "lora_bits"): (4,)}


_BOUNDS: dict[tuple[str, str], dict] = {
    ("cluster", "gpu_memory_gib"): {"exclusiveMinimum": 0}, ("cluster", "gpu_tflops"): {"exclusiveMinimum": 0},
    ("cluster", "host_memory_gib"): {"exclusiveMinimum": 0},
    ("training", "lr"): {"exclusiveMinimum": 0}, ("training", "eps"): {"exclusiveMinimum": 0},
    ("training", "min_lr_ratio"): {"minimum": 0, "maximum": 1}, ("training", "weight_decay"): {"minimum": 0},
    ("training", "grad_clip"): {"minimum": 0}, ("constraints", "memory_headroom"): {"minimum": 0, "maximum": 0.9},
    ("training", "lora_alpha"): {"exclusiveMinimum": 0},
    ("training", "lora_dropout"): {"minimum": 0, "exclusiveMaximum": 1},
}
"""Ranges of the number fields, as the ``__post_init__`` checks of ``dstk.intent`` state them. Every integer
field other than zero_stage is a count (``_positive``): minimum 1."""


def _field_schema(section: str, name: str, hint, default) -> dict:
    """One field: its annotation as JSON types, its choices, range, default and docstring."""
    import types
    import typing

    from dstk.intent import field_doc

    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    nullable = type(None) in options
    (base,) = [o for o in options if o is not type(None)]
    choices = _choices().get((section, name))
    if choices is not None:
        node: dict = {"enum": list(choices)}
    elif typing.get_origin(base) is tuple:
        items = [{"type": "number", "minimum": 0, "exclusiveMaximum": 1} for _ in typing.get_args(base)]
        node = {"type": "array", "prefixItems": items, "minItems": len(items), "maxItems": len(items)}
    elif base is bool:
        node = {"type": "boolean"}
    elif base is str:
        node = {"type": "string"}
    elif base in (int, float):
        number = ({"type": "integer", "minimum": 1} if base is int
                  else {"type": "number", **_BOUNDS.get((section, name), {})})
        node = {"anyOf": [number, {"type": "string", "pattern": _NUMBER_TEXT}]}
    else:
        raise TypeError(f"no JSON Schema for {section}.{name}: {hint!r}")  # a new annotation: teach it here
    if nullable:  # None: "let dstk choose", written `null` or left out
        node = ({"enum": [*choices, None]} if choices is not None
                else {"anyOf": [*node.get("anyOf", [node]), {"type": "null"}]})
    out = {"description": field_doc(section, name), **node}
    if default is not None and default is not dataclasses.MISSING:
        out["default"] = list(default) if isinstance(default, tuple) else default
    return out


def intent_schema() -> dict:
    """The intent YAML's JSON Schema (draft 2020-12), built from the dataclasses of ``dstk.intent``: one
    property per field (its annotation, docstring and default), unknown keys refused at every level as
    ``intent_from_dict`` refuses them, ``model`` required with either a name or the four dimensions."""
    import inspect
    import typing

    from dstk.intent import REQUIRED_DIMS, SECTIONS, Intent

    sections = {}
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        props = {f.name: _field_schema(section, f.name, hints[f.name], f.default) for f in dataclasses.fields(cls)}
        sections[section] = {"type": ["object", "null"], "description": " ".join(inspect.getdoc(cls).split()),
                             "properties": props, "additionalProperties": False}
    dims = list(REQUIRED_DIMS)
    sections["model"]["anyOf"] = [
        {"title": "a preset or HF config", "required": ["name"],
         "not": {"anyOf": [{"required": [d]} for d in dims]}},
        {"title": "GPT-style dimensions", "required": dims, "not": {"required": ["name"]}},
    ]
    sections["model"]["type"] = "object"
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "dstk intent", "description": " ".join(inspect.getdoc(Intent).split()),
            "type": "object", "properties": sections, "required": ["model"], "additionalProperties": False}
