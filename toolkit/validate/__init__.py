"""``dstk.validate``: check a DeepSpeed 0.19.8 config before DeepSpeed does.

Fast: imports json and (for non-JSON files) hjson; never jsonschema (:mod:`dstk.validate.checker` checks the
schema's keywords), torch, deepspeed or transformers.

    findings = validate_config(config, world_size=8, tensor_parallel=2)   # a dict
    findings = validate_file("ds_config.json", hf=True)                  # a path: adds line/column

The checks: the shipped JSON Schema of every key DeepSpeed reads (unknown keys are errors at every
level), keys removed in 0.19.8, ``"auto"`` (error unless ``hf``, then only where the Trainer fills it),
and the cross-field rules of :mod:`dstk.validate.rules`.
"""

from __future__ import annotations

import errno
import os
import stat

from dstk.findings import Finding
from dstk.validate.rules import HF_FILLS, RULES, Context, split_auto, split_removed
from dstk.validate.schema import findings_for, load_schema
from dstk.validate.source import MAX_BYTES, Document, parse_bytes, parse_text

__all__ = ["HF_FILLS", "Document", "Finding", "parse_text", "read_document", "validate_config",
           "validate_document", "validate_file", "load_schema"]


def validate_config(config: dict, *, world_size: int | None = None, tensor_parallel: int = 1,
                    pipeline_stages: int = 1, hf: bool = False) -> list[Finding]:
    """All findings for one config dict, in a stable order (by pointer, then code).

    ``world_size`` is the total number of ranks; the data-parallel size is
    ``world_size / (tensor_parallel x pipeline_stages)``. Without it the batch triad is only checked
    for internal consistency.
    """
    if not isinstance(config, dict):
        return [Finding(severity="error", code="DS003", message=f"the config is a {type(config).__name__}, "
                        "not a JSON object", hint="a DeepSpeed config is one JSON object")]
    for name, value in (("tensor_parallel", tensor_parallel), ("pipeline_stages", pipeline_stages)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
    if world_size is not None and (not isinstance(world_size, int) or world_size < 1):
        raise ValueError(f"world_size: expected an integer >= 1 or None, got {world_size!r}")
    cleaned, findings = split_removed(config)
    cleaned, auto = split_auto(cleaned, Context(world_size=world_size, tensor_parallel=tensor_parallel,
                                                pipeline_stages=pipeline_stages, hf=hf))
    findings += auto
    ctx = Context(world_size=world_size, tensor_parallel=tensor_parallel, pipeline_stages=pipeline_stages, hf=hf,
                  auto_pointers=frozenset(f.pointer for f in auto) | _hf_filled(config, hf))
    findings += findings_for(cleaned)
    for rule in RULES:
        findings.extend(rule(cleaned, ctx))
    # a required key whose "auto" was taken out is reported once, as "auto" (DS107/DS108), not also as missing
    findings = [f for f in findings if not (f.code == "DS110" and f.pointer in ctx.auto_pointers)]
    return _dedupe(findings)


def _hf_filled(config: dict, hf: bool) -> frozenset[str]:
    if not hf:
        return frozenset()
    out = set()
    for pointer in HF_FILLS:
        node = config
        for part in pointer.strip("/").split("/"):
            node = node.get(part) if isinstance(node, dict) else None
        if node == "auto":
            out.add(pointer)
    return frozenset(out)


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen = set()
    out = []
    for f in findings:
        key = (f.code, f.pointer, f.message)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def _locate(findings: list[Finding], doc: Document) -> list[Finding]:
    out = []
    for f in findings:
        if f.line is None and doc.positions:
            pointer = f.pointer
            while pointer not in doc.positions and pointer:
                pointer = pointer.rsplit("/", 1)[0]
            if pointer in doc.positions:
                line, col = doc.positions[pointer]
                f = Finding(severity=f.severity, code=f.code, message=f.message, pointer=f.pointer, line=line,
                            column=col, hint=f.hint)
        out.append(f)
    return out


def locate(findings: list[Finding], doc: Document) -> list[Finding]:
    """Give findings made outside ``validate_document`` (``--training-args``) their line and column."""
    return _locate(findings, doc)


_DEEPSPEED_ONLY = ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size")


def foreign_setup(config: dict, *, path: str | None = None) -> Finding | None:
    """One finding, instead of a DS101 for every key, when the file is another tool's setup (an accelerate
    config, a LLaMA-Factory or axolotl YAML, ``TrainingArguments``) rather than a DeepSpeed config: told by
    ``dstk.importers.detect_kind``, and only when no key only DeepSpeed reads is there."""
    if set(config) & set(_DEEPSPEED_ONLY) or isinstance(config.get("optimizer"), dict):
        return None
    from dstk.importers import detect_kind

    kind = detect_kind("", config)
    if kind == "hf-args" and not {"per_device_train_batch_size", "output_dir"} & set(config):
        return None
    if kind not in ("accelerate", "llamafactory", "axolotl", "hf-args"):
        return None
    names = {"accelerate": "an accelerate config", "llamafactory": "a LLaMA-Factory training YAML",
             "axolotl": "an axolotl YAML", "hf-args": "TrainingArguments"}
    block = config.get("deepspeed_config")
    named = (block.get("deepspeed_config_file") if isinstance(block, dict) else None) or config.get("deepspeed")
    follow = (f"validate the DeepSpeed config it names: dstk validate {named} --hf" if isinstance(named, str)
              and named not in ("", "none") else "it names no DeepSpeed config file to validate")
    this = path or "FILE"
    return Finding(severity="error", code="DS101", pointer="", message=f"this is {names[kind]}, not a DeepSpeed "
                   f"config: DeepSpeed does not read its {len(config)} top-level keys this way",
                   hint=f"{follow}; to check the run it describes: dstk import {this} (or dstk plan --from {this})")


def foreign_file(path: str | os.PathLike) -> Finding | None:
    """``foreign_setup`` for a ``.yaml``/``.yml`` file read as YAML (hjson misreads YAML's nesting, lists and
    comments, or fails on them with DS001); None for anything else or a YAML that does not parse."""
    if not str(path).endswith((".yaml", ".yml")):
        return None
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            config = yaml.safe_load(fh.read(MAX_BYTES + 1))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return None
    return foreign_setup(config, path=str(path)) if isinstance(config, dict) else None


def validate_document(doc: Document, **options) -> list[Finding]:
    findings = list(doc.findings)
    foreign = foreign_setup(doc.config) if isinstance(doc.config, dict) else None
    if foreign is not None:
        return [foreign]
    if isinstance(doc.config, dict):
        non_finite = {f.pointer for f in doc.findings if f.code == "DS009"}  # one finding per cause: not also a range
        findings += [f for f in validate_config(doc.config, **options) if f.pointer not in non_finite]
    located = _locate(findings, doc)
    return sorted(located, key=lambda f: (f.line is None, f.line or 0, f.column or 0))


def read_document(path: str | os.PathLike) -> Document:
    """Read and parse one file; ``OSError`` for a path that cannot be read or is not a regular file (a FIFO or
    a device would block or never end: the CLI's exit 2)."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else
                "not a regular file")
        raise OSError(errno.EINVAL, f"is {kind}, not a config file", str(path))
    with open(path, "rb") as fh:
        data = fh.read(MAX_BYTES + 1)
    return parse_bytes(data)


def validate_file(path: str | os.PathLike, *, world_size: int | None = None, tensor_parallel: int = 1,
                  pipeline_stages: int = 1, hf: bool = False) -> list[Finding]:
    """Findings for one file, with line and column; raises ``OSError`` if it cannot be read."""
    return validate_document(read_document(path), world_size=world_size, tensor_parallel=tensor_parallel,
                             pipeline_stages=pipeline_stages, hf=hf)
