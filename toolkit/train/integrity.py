"""Checkpoint and run-directory integrity, checked in the parent before any rank starts.

A checkpoint file cut short (a full disk, a copy interrupted, a node lost mid-write) or left at
0 bytes, and a 0-byte ``config.json``, make ``torch.load`` / ``AutoConfig`` raise ``RuntimeError``,
``EOFError`` or ``OSError`` deep inside export or inside every rank of a resume. These checks read
only the files' structure, without torch:

- ``torch.save`` writes a zip archive (torch >= 1.6, ``_use_new_zipfile_serialization``) whose index
  (the central directory and its end record) comes last: a truncated archive has lost it, so
  ``zipfile`` cannot open it (a 1-byte cut is enough; the test cuts 1%, 50% and 99%);
- a ``.safetensors`` file is an 8-byte little-endian header length, a JSON header whose tensors'
  ``data_offsets`` end at the last byte of the file (the safetensors format spec);
- JSON files parse, and no file is empty.

``latest`` (DeepSpeed's tag file, read by ``load_checkpoint(tag=None)``) must name a directory inside
the checkpoint directory. A run directory that was copied elsewhere resumes into itself: the paths
``dstk finetune`` recorded (finetune.json, ds_config.json's monitor paths) are rebased onto the copy.
"""

from __future__ import annotations

import json
import os
import re
import struct
import zipfile
from pathlib import Path

from dstk.errors import DstkError

_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
_STEP_RE = re.compile(r"(\d+)$")


def file_problem(path: str | os.PathLike) -> str | None:
    """What is wrong with one checkpoint or config file, or None when its structure is whole."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if size == 0:
        return "is empty (0 bytes)"
    name = path.name
    try:
        if name.endswith(_TORCH_SUFFIXES):
            return _torch_problem(path, size)
        if name.endswith(".safetensors"):
            return _safetensors_problem(path, size)
        if name.endswith(".json"):
            json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        return f"is not valid JSON ({exc})"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return None


def _torch_problem(path: Path, size: int) -> str | None:
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"PK\x03\x04":
        # torch's legacy (pre-1.6) format is a pickle stream; it has no index to check.
        return None if head[:1] == b"\x80" else f"is not a torch checkpoint (it starts with {head!r})"
    try:
        # A cut removes the end first, and with it the end-of-central-directory record zipfile looks for.
        zipfile.ZipFile(path).close()
    except zipfile.BadZipFile:
        return f"is truncated or corrupt ({size:,} bytes; the zip index torch.save writes at its end is missing)"
    return None


def _safetensors_problem(path: Path, size: int) -> str | None:
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            return f"is truncated ({size} bytes; no header)"
        (n,) = struct.unpack("<Q", raw)
        if n > size - 8:
            return f"is truncated ({size:,} bytes; its header alone needs {n + 8:,})"
        header = json.loads(f.read(n))
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    need = 8 + n + max(ends, default=0)
    if need > size:
        return f"is truncated ({size:,} bytes of {need:,})"
    return None


def tag_problems(tag_dir: str | os.PathLike) -> list[tuple[Path, str]]:
    """(file, problem) for every damaged file of a checkpoint tag directory."""
    found = []
    for path in sorted(Path(tag_dir).rglob("*")):
        if path.is_file():
            problem = file_problem(path)
            if problem is not None:
                found.append((path, problem))
    return found


def resolve_tag(checkpoint_dir: str | os.PathLike, tag: str | None = None) -> Path | None:
    """The tag directory ``tag`` (or the one ``latest`` names), refused when it lies outside
    ``checkpoint_dir``; None when there is no ``latest`` and no ``tag``."""
    root = Path(checkpoint_dir)
    source = "--tag"
    if tag is None:
        latest = root / "latest"
        if not latest.is_file():
            return None
        tag, source = latest.read_text(encoding="utf-8", errors="replace").strip(), f"{latest}"
        if not tag:
            raise DstkError(f"{latest} is empty: it should name the newest checkpoint's directory",
                            hint=f"pass --tag with one of the directories in {root}, or write that name into {latest}")
    target = root / tag
    inside = root.resolve()
    try:
        resolved = target.resolve()
    except OSError:
        resolved = target
    if os.path.isabs(tag) or ".." in Path(tag).parts or not resolved.is_relative_to(inside) or resolved == inside:
        raise DstkError(f"{source} names {tag!r}, which lies outside the checkpoint directory {root}"
                        + (f" (it resolves to {resolved})" if resolved != target else ""),
                        hint=f"a checkpoint tag is a directory inside {root}; pass --tag with one of them, "
                             f"or correct {root / 'latest'}")
    return target


def _step_of(name: str) -> int | None:
    m = _STEP_RE.search(name)
    return int(m.group(1)) if m else None


def previous_complete(checkpoint_dir: str | os.PathLike, *, before: Path) -> Path | None:
    """The newest tag directory older than ``before`` whose files are all whole (dstk's tags also
    need their completeness marker), or None."""
    from dstk.train.checkpoint import MARKER

    root = Path(checkpoint_dir)
    limit = _step_of(before.name)
    tags = []
    for child in root.iterdir() if root.is_dir() else ():
        step = _step_of(child.name)
        if not child.is_dir() or child.name.startswith((".", "damaged-")) or step is None or child == before:
            continue
        if limit is not None and step >= limit:
            continue
        if child.name.startswith("step-") and not (child / MARKER).is_file():
            continue
        tags.append((step, child))
    for _step, child in sorted(tags, reverse=True):
        if not tag_problems(child):
            return child
    return None


def _damaged(tag_dir: Path, problems: list[tuple[Path, str]]) -> str:
    shown = "; ".join(f"{p} {why}" for p, why in problems[:3])
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return f"checkpoint {tag_dir} is damaged: {shown}{more}"


def check_export(checkpoint_dir: str | os.PathLike, *, tag: str | None, config: str | None,
                 output: str = "HF_DIR") -> None:
    """``dstk export``'s checks: the tag inside the directory, its files whole, the HF config readable."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        from dstk.errors import UsageError

        what = "is not a directory" if root.exists() else "does not exist"
        raise UsageError(f"checkpoint directory {root} {what}",
                         hint="give the directory DeepSpeed's save_checkpoint wrote into (for a `dstk finetune` run: "
                              "OUTPUT/checkpoints)")
    tag_dir = resolve_tag(root, tag) or root
    if tag_dir.is_dir():
        problems = tag_problems(tag_dir)
        if problems:
            prev = previous_complete(root, before=tag_dir) if tag_dir != root else None
            hint = (f"export the previous complete checkpoint: dstk export {root} --tag {prev.name} --output {output}"
                    if prev is not None else
                    "no earlier complete checkpoint here: restore the file from a copy, or retrain")
            raise DstkError(_damaged(tag_dir, problems), hint=hint)
    candidates = ([Path(config)] if config is not None else
                  [root, tag_dir, root.parent, root.parent / "model", root.parent / "prepared" / "model_config"])
    for i, place in enumerate(candidates):
        file = place / "config.json" if place.is_dir() else place
        if file.is_file():
            problem = file_problem(file) if file.suffix == ".json" else None
            if problem is not None:
                good = next((c for c in candidates[i + 1:]
                             if (c / "config.json").is_file() and file_problem(c / "config.json") is None), None)
                raise DstkError(f"the HF config {file} {problem}",
                                hint=(f"pass --config {good}" if good is not None else
                                      "pass --config with the HF directory (or config.json) the training started from"))
            return


def _rewrite_paths(value, old: str, new: str):
    if isinstance(value, str):
        if value == old:
            return new
        if value.startswith(old + os.sep):
            return new + value[len(old):]
        return value
    if isinstance(value, dict):
        return {k: _rewrite_paths(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_rewrite_paths(v, old, new) for v in value]
    return value


RECORDED_FILES = ("finetune.json", "ds_config.json", "ds_config.hf.json")
"""The files of a finetune run directory that hold paths into it (the rank spec; the csv/tensorboard
monitors' ``output_path``)."""


def rebase_run(output_dir: str | os.PathLike, *, log=lambda s: None) -> str | None:
    """A run directory copied (or moved) elsewhere: rewrite every path its files recorded under the
    old location to the same path under ``output_dir``, so that a resume reads and writes the copy,
    never the original. Returns the old location, or None when nothing moved."""
    from dstk.launch.run import write_atomic

    out = Path(output_dir)
    spec_file = out / "finetune.json"
    data = json.loads(spec_file.read_text(encoding="utf-8"))
    old = str(data.get("output_dir") or "")
    new = str(out.resolve())
    if not old or old == new:
        return None
    # A symlinked path to the same directory is not a copy.
    try:
        if Path(old).exists() and os.path.samefile(old, new):
            return None
    except OSError:
        pass
    for name in RECORDED_FILES:
        path = out / name
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        rebased = _rewrite_paths(json.loads(text), old, new)
        write_atomic(path, json.dumps(rebased, indent=2) + "\n")
    log(f"this run directory was copied from {old}: its recorded paths now point into {new}")
    return old


def check_resume(output_dir: str | os.PathLike, *, log=lambda s: None) -> None:
    """``dstk finetune --resume``'s checks in the parent, before any rank starts: the run's own files
    readable, rebased onto this directory if it was copied, ``latest`` inside the checkpoints, and
    the newest complete checkpoint whole (else: which file, and the previous complete one)."""
    from dstk.train.checkpoint import newest_complete

    out = Path(output_dir)
    spec_file = out / "finetune.json"
    if not spec_file.is_file():
        return  # prepare() says how to start a run
    for name in RECORDED_FILES:
        if (out / name).is_file():
            problem = file_problem(out / name)
            if problem is not None:
                raise DstkError(f"{out / name} {problem}: this run's settings cannot be read",
                                hint="it is written when the run starts and not repaired by a resume: start a new "
                                     "--output (the checkpoints in this one stay usable with `dstk export`)")
    rebase_run(out, log=log)
    spec = json.loads(spec_file.read_text(encoding="utf-8"))
    model_config = Path(str(spec.get("model_source", ""))) / "config.json"
    if model_config.is_file() and (problem := file_problem(model_config)) is not None:
        raise DstkError(f"the model config {model_config} {problem}",
                        hint="restore it from the model you started from (for a random-init run it is written from "
                             "the plan: start a new --output)")
    for key in ("train_blocks", "eval_blocks"):
        if spec.get(key) and (problem := file_problem(spec[key])) is not None:
            raise DstkError(f"the prepared data {spec[key]} {problem}", hint="start a new --output to prepare it again")
    root = out / "checkpoints"
    if not root.is_dir():
        return
    resolve_tag(root)  # a ``latest`` pointing elsewhere is refused, even though dstk resumes by its markers
    found = newest_complete(root)
    if found is None:
        return
    tag_dir = root / found[1]
    problems = tag_problems(tag_dir)
    if not problems:
        return
    prev = previous_complete(root, before=tag_dir)
    aside = tag_dir.with_name(f"damaged-{tag_dir.name}")
    if prev is not None:
        hint = (f"resume from the previous complete checkpoint {prev}: move the damaged one aside "
                f"(mv {tag_dir} {aside}) and run `dstk finetune --resume --output {out}` again")
    else:
        hint = (f"no earlier complete checkpoint: move it aside (mv {tag_dir} {aside}) to start again from step 1, "
                "or start a new --output")
    raise DstkError(_damaged(tag_dir, problems), hint=hint)


def finetune_model_config(checkpoint_dir: str | os.PathLike, *, tag: str | None = None) -> str | None:
    """The HF directory a ``dstk finetune`` run started from, for ``dstk export OUT/checkpoints`` when no
    ``config.json`` lies in the places ``export_hf`` looks (the checkpoint directory, its tag, OUT,
    OUT/model, OUT/prepared/model_config): a run from ``--model HF_DIR`` keeps its config there, not in
    OUT, and has no OUT/model until it finished. Read from OUT/finetune.json's ``model_source``; None when
    this is no finetune run, a standard place has a config.json, or the source has none."""
    root = Path(checkpoint_dir)
    out = root.parent
    tag_dir = resolve_tag(root, tag) if root.is_dir() else None
    places = [root, tag_dir or root, out, out / "model", out / "prepared" / "model_config"]
    if any((p / "config.json").is_file() for p in places) or not (out / "finetune.json").is_file():
        return None
    try:
        source = json.loads((out / "finetune.json").read_text(encoding="utf-8")).get("model_source")
    except (OSError, ValueError, AttributeError):
        return None  # check_export / check_resume name a damaged settings file
    return str(source) if source and (Path(str(source)) / "config.json").is_file() else None


def refuse_lora_export(checkpoint_dir: str | os.PathLike) -> None:
    """``dstk export`` of a LoRA ``dstk finetune`` run's checkpoints: they hold the PEFT model (the frozen base
    under ``base_model.model.`` and the adapters), which ``export_hf`` does not merge; it failed with "the
    checkpoint does not match LlamaForCausalLM" and a fix that could not work (``--config``). Refused with
    what the run writes instead: OUTPUT/adapter (and OUTPUT/model with ``--merge``) at its end."""
    out = Path(checkpoint_dir).parent
    try:
        spec = json.loads((out / "finetune.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(spec, dict) or not spec.get("lora"):
        return
    done = [str(out / d) for d in ("adapter", "model") if (out / d / "config.json").is_file()
            or (out / d / "adapter_config.json").is_file()]
    raise DstkError(f"{checkpoint_dir} holds a LoRA run's checkpoints (the PEFT model: frozen base and adapters), "
                    "which `dstk export` does not merge",
                    hint=(f"use what the run exported: {', '.join(done)}" if done else
                          f"`dstk finetune --resume --output {out}` trains on to the end and writes the adapter "
                          f"({out / 'adapter'}) and, with --merge, the merged model"))
