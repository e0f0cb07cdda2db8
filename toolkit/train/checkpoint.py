"""Checkpoints that are complete or absent.

``engine.save_checkpoint`` writes a tag directory file by file and then the ``latest`` file; a
rank killed half-way leaves a tag that loads as garbage or not at all. So every rank writes into a
hidden temporary tag (``.tmp-step-000010``); after a barrier, rank 0 drops a ``dstk_complete.json``
marker into it, renames it to ``step-000010`` (``rename`` is atomic on POSIX) and only then points
``latest`` at it (temp file + ``os.replace``). The newest complete checkpoint is the highest step
directory holding the marker; temporary tags are ignored and removed on resume.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

MARKER = "dstk_complete.json"
_STEP = re.compile(r"^step-(\d{6,})$")


def tag_for(step: int) -> str:
    return f"step-{step:06d}"


def temp_tag_for(step: int) -> str:
    return f".tmp-{tag_for(step)}"


def newest_complete(checkpoint_dir: str | os.PathLike) -> tuple[int, str] | None:
    """(step, tag) of the newest complete checkpoint, or None."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return None
    found = []
    for child in root.iterdir():
        m = _STEP.match(child.name)
        if m and (child / MARKER).is_file():
            found.append((int(m.group(1)), child.name))
    return max(found) if found else None


def publish(checkpoint_dir: str | os.PathLike, *, step: int, meta: dict) -> Path:
    """Rank 0, after every rank finished writing the temporary tag: mark, rename, point ``latest``."""
    from dstk.launch.run import write_atomic

    root = Path(checkpoint_dir)
    tmp, final = root / temp_tag_for(step), root / tag_for(step)
    write_atomic(tmp / MARKER, json.dumps({"step": step, **meta}) + "\n")
    if final.exists():  # a re-run of the same step after a resume: replace the older copy
        shutil.rmtree(final)
    os.rename(tmp, final)
    write_atomic(root / "latest", tag_for(step))
    return final


def remove_partial(checkpoint_dir: str | os.PathLike) -> list[Path]:
    """Delete temporary tags a crash left behind; return them."""
    root = Path(checkpoint_dir)
    gone = [p for p in root.glob(".tmp-step-*") if p.is_dir()] if root.is_dir() else []
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


_HF_STEP = re.compile(r"^checkpoint-(\d+)$")


def newest_hf_trainer(checkpoint_dir: str | os.PathLike) -> int | None:
    """The step of the newest checkpoint the HF Trainer finished writing (``checkpoint-N`` holding the
    ``trainer_state.json`` that ``Trainer._save_checkpoint`` writes after the model, the optimizer and the RNG
    states: transformers 5.25 trainer.py lines 3421-3461), or None."""
    root = Path(checkpoint_dir)
    steps = [int(m.group(1)) for child in (root.iterdir() if root.is_dir() else ())
             if (m := _HF_STEP.match(child.name)) and (child / "trainer_state.json").is_file()]
    return max(steps) if steps else None


def stopped_note(output_dir: str | os.PathLike, *, num_steps: int, save_every: int, trainer: str = "native") -> str:
    """What a run that stopped before its end (a signal, a failed or lost rank) kept, and the command that
    goes on from it: the newest complete checkpoint and ``dstk finetune --resume``; or, when none was
    written, that a resume starts again at step 1 and ``--save-every`` would have kept the progress
    (its default, 0, saves only at the end); or, when the last step's checkpoint is there, that the same
    command exports it (the worker's loop then has no step left to train)."""
    out = Path(output_dir)
    root = out / "checkpoints"
    if trainer == "hf":
        step = newest_hf_trainer(root)
        where = None if step is None else root / f"checkpoint-{step}"
    else:
        found = newest_complete(root)
        step, where = (None, None) if found is None else (found[0], root / found[1])
    resume = f"dstk finetune --resume --output {out}"
    if step is None:
        due = ("checkpoints are written only at the end (--save-every 0)" if save_every <= 0 else
               f"the first was due at step {save_every} (--save-every {save_every})")
        return (f"no complete checkpoint in {root}: {due}; `{resume}` trains again from step 1. "
                f"Pass --save-every N to a new run to keep its progress.")
    if step >= num_steps:
        return (f"the run trained all {num_steps} steps (checkpoint {where}); `{resume}` evaluates and exports it "
                f"without training again")
    return (f"the newest complete checkpoint is step {step} of {num_steps} ({where}); `{resume}` goes on "
            f"from step {step + 1}")
