"""The configs dstk ships (templates/presets) pass its own validator: plain DeepSpeed presets in
plain mode, HF presets (with "auto") in --hf mode."""

from __future__ import annotations

import pathlib

import pytest

from dstk.validate import validate_file

PRESETS = pathlib.Path(__file__).resolve().parent.parent / "templates" / "presets"
FILES = sorted(PRESETS.rglob("*.json"))


def test_presets_are_found():
    assert len(FILES) >= 2, f"no presets under {PRESETS}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PRESETS)))
def test_preset_validates(path):
    hf = "hf" in path.relative_to(PRESETS).parts[:-1]
    findings = validate_file(path, hf=hf)
    assert [(f.code, f.pointer, f.message) for f in findings if f.severity == "error"] == []
