"""``dstk upgrade``: rewrite a DeepSpeed config's removed and renamed keys for the release dstk checks against."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from dstk.errors import DstkError, UsageError

HELP = "rewrite removed and renamed DeepSpeed config keys; show the diff, write with --write"
DESCRIPTION = (
    "Rewrite what the target DeepSpeed release (0.14-0.19; --deepspeed-version, else chosen as `dstk validate` "
    "chooses) removed or renamed (the tables `dstk validate` uses: DS105 removed keys, DS106 "
    "legacy forms): removed top-level and ZeRO keys are deleted, `bfloat16` becomes `bf16`, `zero_optimization: "
    "true` becomes a stage, `cpu_offload`/`cpu_offload_param` become offload blocks, "
    "`stage3_gather_fp16_weights_on_model_save` becomes `stage3_gather_16bit_weights_on_model_save`. Prints a "
    "unified diff; --write replaces the file atomically and keeps a backup. Exit 0, 1 when the result still "
    "has validation errors, 2 on usage errors."
)
TARGETS = ("0.14", "0.15", "0.16", "0.17", "0.18", "0.19")
"""The releases whose key tables ship (``dstk.validate.versions.SHIPPED``; 0.14.5 etc. take their minor)."""
RENAMED_TOP_LEVEL = {"seq_parallel_comm_data_type": "seq_parallel_communication_data_type"}
"""Top-level keys renamed between releases (``runtime/constants.py`` ``SEQ_PARALLEL_COMMUNICATION_DATA_TYPE``
holds the old name in 0.14-0.15, the new one from 0.16): renamed when the target reads only the new name."""


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Change:
    """One rewrite: the JSON pointer it touched, what was done and why."""

    pointer: str
    action: str
    """removed, renamed or rewritten."""
    why: str


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", help="a DeepSpeed JSON config (- reads standard input)")
    parser.add_argument("--deepspeed-version", default=None, metavar="X",
                        help=f"target release ({', '.join(TARGETS)}, or a patch release of one); default as for "
                             "validate: [tool.dstk] deepspeed_version, the installed deepspeed, a pin, else the newest")
    parser.add_argument("--write", action="store_true", help="replace the file (atomically; CONFIG.bak keeps the old)")
    parser.add_argument("--format", choices=["human", "json"], default="human")


def _rename(node: dict, old: str, new: str, value) -> dict:
    """``node`` with ``old`` replaced by ``new`` (value ``value``) at the same position."""
    return {(new if k == old else k): (value if k == old else v) for k, v in node.items()}


def upgrade_config(config: dict) -> tuple[dict, list[Change]]:
    """The config rewritten for DeepSpeed 0.19.8, and one ``Change`` per rewrite.

    Removed keys: ``deepspeed/runtime/config.py`` ``_REMOVED_TOP_LEVEL_CONFIG_KEYS`` and the ZeRO keys
    ``DeepSpeedZeroConfig`` no longer has (``dstk.validate.rules.REMOVED_TOP_LEVEL`` / ``REMOVED_ZERO``).
    Renames: the ``deprecated`` fields of ``deepspeed/runtime/zero/config.py`` with their ``new_param``
    (``cpu_offload`` -> ``offload_optimizer: {device: cpu}``, ``cpu_offload_param`` -> ``offload_param``,
    ``cpu_offload_use_pin_memory`` -> ``pin_memory`` of those blocks, ``stage3_gather_fp16_weights_on_model_save``
    -> ``stage3_gather_16bit_weights_on_model_save``), ``bfloat16`` -> ``bf16`` (``runtime/config.py`` reads
    ``bfloat16`` only when ``bf16`` is absent) and the boolean ``zero_optimization`` (stage 0 or 1)."""
    from dstk.validate.rules import removed_tables
    from dstk.validate.schema import load_schema

    REMOVED_TOP_LEVEL, REMOVED_ZERO, _ = removed_tables()  # the target release's (dstk.validate.schema.using)
    changes: list[Change] = []
    out = dict(config)
    for key, why in REMOVED_TOP_LEVEL.items():
        if key in out:
            del out[key]
            changes.append(Change(pointer=f"/{key}", action="removed", why=why))
    target_keys = load_schema()["properties"]
    for old, new in RENAMED_TOP_LEVEL.items():
        if old in out and old not in target_keys and new in target_keys:
            if new in out:
                del out[old]
                changes.append(Change(pointer=f"/{old}", action="removed", why=f"'{new}' is set"))
            else:
                out = _rename(out, old, new, out[old])
                changes.append(Change(pointer=f"/{old}", action="renamed",
                                      why=f"DeepSpeed {load_schema()['x-dstk-deepspeed-version']} reads it as '{new}'"))
    if "bfloat16" in out:
        if "bf16" in out:
            del out["bfloat16"]
            changes.append(Change(pointer="/bfloat16", action="removed",
                                  why="'bf16' is set too, and DeepSpeed reads 'bf16' and ignores 'bfloat16'"))
        else:
            out = _rename(out, "bfloat16", "bf16", out["bfloat16"])
            changes.append(Change(pointer="/bfloat16", action="renamed", why="'bfloat16' is the legacy name of 'bf16'"))
    zero = out.get("zero_optimization")
    if isinstance(zero, bool):
        out["zero_optimization"] = {"stage": int(zero)}
        changes.append(Change(pointer="/zero_optimization", action="rewritten",
                              why=f"the boolean form means stage {int(zero)}"))
    elif isinstance(zero, dict):
        zero = dict(zero)
        for key, why in REMOVED_ZERO.items():
            if key in zero:
                del zero[key]
                changes.append(Change(pointer=f"/zero_optimization/{key}", action="removed", why=why))
        pin = zero.get("cpu_offload_use_pin_memory")
        for old, new in (("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")):
            if old not in zero:
                continue
            pointer = f"/zero_optimization/{old}"
            if zero[old] is True and new not in zero:
                block = {"device": "cpu"} if pin is None else {"device": "cpu", "pin_memory": bool(pin)}
                zero = _rename(zero, old, new, block)
                moved = "" if pin is None else f" (with cpu_offload_use_pin_memory's {str(bool(pin)).lower()})"
                changes.append(Change(pointer=pointer, action="renamed",
                                      why=f"'{old}: true' is the deprecated form of '{new}: {json.dumps(block)}'"
                                          + moved))
            else:
                del zero[old]
                changes.append(Change(pointer=pointer, action="removed",
                                      why=f"'{new}' is set" if new in zero else f"'{old}: false' is the default"))
        if "cpu_offload_use_pin_memory" in zero:
            del zero["cpu_offload_use_pin_memory"]
            # runtime/zero/config.py: set_new_param False, so DeepSpeed reads it nowhere; the blocks the
            # rename above did not write keep their own pin_memory (default false): say how to keep it
            unpinned = [name for name in ("offload_optimizer", "offload_param")
                        if isinstance(zero.get(name), dict) and "pin_memory" not in zero[name]]
            why = "deprecated: pin_memory now lives in the offload blocks"
            if pin and unpinned:
                why += (f"; DeepSpeed reads it nowhere, so {' and '.join(unpinned)} "
                        f"{'run' if len(unpinned) > 1 else 'runs'} unpinned: add \"pin_memory\": true there to pin")
            changes.append(Change(pointer="/zero_optimization/cpu_offload_use_pin_memory", action="removed", why=why))
        old, new = "stage3_gather_fp16_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"
        if old in zero:
            if new in zero or "gather_16bit_weights_on_model_save" in zero:
                del zero[old]
                changes.append(Change(pointer=f"/zero_optimization/{old}", action="removed", why=f"'{new}' is set"))
            else:
                zero = _rename(zero, old, new, zero[old])
                changes.append(Change(pointer=f"/zero_optimization/{old}", action="renamed",
                                      why=f"deprecated name of '{new}'"))
        out["zero_optimization"] = zero
    return out, changes


def _indent(text: str) -> int:
    for line in text.splitlines()[1:]:
        stripped = line.lstrip(" ")
        if stripped and len(stripped) < len(line):
            return len(line) - len(stripped)
    return 2


def _backup_path(path: str) -> str:
    candidate, n = f"{path}.bak", 1
    while os.path.exists(candidate):
        candidate, n = f"{path}.bak.{n}", n + 1
    return candidate


def _write(path: str, text: str) -> str:
    """Replace ``path`` with ``text`` atomically (a synced temporary file renamed over it), after a backup
    copy. A symbolic link is followed: its target is rewritten, the link kept (``os.replace`` on the link
    itself swapped it for a plain file and left the target, which other users of it read, unchanged)."""
    import shutil
    import tempfile

    path = os.path.realpath(path) if os.path.islink(path) else path
    backup = _backup_path(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        shutil.copy2(path, backup)
        fd, tmp = tempfile.mkstemp(prefix=".dstk-upgrade-", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        shutil.copymode(path, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}", hint="check the directory is writable") from None
    return backup


def run(args: argparse.Namespace) -> int:
    from dstk.validate.project import settings_for
    from dstk.validate.schema import using
    from dstk.validate.versions import select

    path = args.config
    where = os.path.join(os.getcwd(), "ds_config.json") if path == "-" else path
    project = settings_for(where) if args.deepspeed_version is None else None
    try:
        selection = select(flag=args.deepspeed_version, project_version=project.deepspeed_version if project else None,
                           project_source=project.source if project else None, config_path=where)
    except ValueError as exc:
        raise UsageError(f"--deepspeed-version: {exc}",
                         hint=f"dstk has the key tables of {', '.join(TARGETS)}") from None
    if selection.nearest:
        raise UsageError(f"DeepSpeed {selection.requested}: dstk has the key tables of {', '.join(TARGETS)} only",
                         hint=f"pass --deepspeed-version with one of {', '.join(TARGETS)}")
    args.deepspeed_version = selection.release
    with using(selection.minor):
        return _upgrade(args, path)


def _upgrade(args: argparse.Namespace, path: str) -> int:
    import difflib

    from dstk.validate import validate_config

    if path == "-":  # standard input: the diff (or JSON) as usual; there is no file to rewrite
        if args.write:
            raise UsageError("--write with - : standard input cannot be rewritten",
                             hint="pass the config's path to --write it, or drop --write to see the diff")
        path, text = "<stdin>", sys.stdin.read()
    else:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror or exc}", hint="check the path") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DstkError(f"not strict JSON ({exc.msg} at line {exc.lineno}); upgrade rewrites JSON only, and would "
                        "lose hjson comments", location=f"{path}:{exc.lineno}:{exc.colno}",
                        hint="fix the JSON (`dstk validate` locates the problem), or edit the keys by hand") from None
    if not isinstance(config, dict):
        raise DstkError("the top level is not a JSON object", location=path, hint="a DeepSpeed config is one object")
    new, changes = upgrade_config(config)
    new_text = text if not changes else json.dumps(new, indent=_indent(text)) + "\n"
    diff = "".join(difflib.unified_diff(text.splitlines(keepends=True), new_text.splitlines(keepends=True),
                                        fromfile=path, tofile=f"{path} (DeepSpeed {args.deepspeed_version})"))
    from dstk.validate.source import has_auto

    remaining = [f for f in validate_config(new, hf=has_auto(new))
                 if f.severity == "error"]
    backup = _write(path, new_text) if args.write and changes else None
    if args.format == "json":
        print(json.dumps({"config": path, "changes": [dataclasses.asdict(c) for c in changes], "diff": diff,
                          "written": backup is not None, "backup": backup,
                          "errors_left": [f"{f.pointer}: {f.message}" for f in remaining]}, indent=2))
    else:
        if diff:
            sys.stdout.write(diff)
        for c in changes:
            print(f"{c.action} {c.pointer}: {c.why}", file=sys.stderr)
        if not changes:
            print(f"{path}: nothing to upgrade for DeepSpeed {args.deepspeed_version}", file=sys.stderr)
        elif backup:
            target = os.path.realpath(path)
            via = f"{target} (through the link {path})" if os.path.islink(path) else path
            print(f"wrote {via} (the old file is {backup})", file=sys.stderr)
        else:
            print(f"{len(changes)} change(s); rerun with --write to apply them", file=sys.stderr)
        for f in remaining:
            print(f"still an error after the upgrade: {f.pointer or '/'}: {f.message}", file=sys.stderr)
    return 1 if remaining else 0


