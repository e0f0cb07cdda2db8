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
