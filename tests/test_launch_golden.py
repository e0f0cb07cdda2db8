"""Golden command lines: one data file per case in tests/data/launch/, every launcher and Slurm.

Each ``*.json`` holds a ``spec`` (LaunchSpec fields; hosts as [name, slots]) and the expected
``command``, ``env`` and ``files`` of ``plan_launch`` -- or, with a ``slurm`` block, the name
of the expected sbatch file next to it. Regenerate after a deliberate change with
``DSTK_UPDATE_GOLDEN=1 pytest tests/test_launch_golden.py`` and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dstk.launch import Host, LaunchSpec, plan_launch
from dstk.launch.slurm import render_sbatch

DATA = Path(__file__).parent / "data" / "launch"
CASES = sorted(DATA.glob("*.json"))
UPDATE = os.environ.get("DSTK_UPDATE_GOLDEN") == "1"
# Every launcher and the sbatch script has at least one case; a glob that finds fewer files fails.
EXPECTED_CASES = 13


def spec_of(data: dict) -> LaunchSpec:
    fields = dict(data)
    fields["hosts"] = tuple(Host(name=n, num_slots=s) for n, s in fields.get("hosts", []))
    fields["env"] = tuple(tuple(kv) for kv in fields.get("env", []))
    return LaunchSpec(**fields)


def test_every_case_is_found():
    assert len(CASES) == EXPECTED_CASES, [p.name for p in CASES]
    launchers = {spec_of(json.loads(p.read_text())["spec"]).launcher for p in CASES}
    assert launchers == {"local", "pdsh", "openmpi", "mpich", "slurm", "torchrun"}
    assert sum("slurm" in json.loads(p.read_text()) for p in CASES) == 2


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden(path: Path):
    case = json.loads(path.read_text())
    spec = spec_of(case["spec"])
    if "slurm" in case:
        sbatch = path.with_suffix(".sbatch")
        got = render_sbatch(spec, sbatch_path=f"{spec.run_dir}/launch.sbatch", **case["slurm"])
        if UPDATE:
            sbatch.write_text(got)
        assert got == sbatch.read_text()
        return
    plan = plan_launch(spec)
    got = {"command": plan.command, "env": plan.env, "files": plan.files}
    if UPDATE:
        case.update(got)
        path.write_text(json.dumps(case, indent=2) + "\n")
    assert got == {k: case[k] for k in ("command", "env", "files")}
