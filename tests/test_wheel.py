"""A wheel built from the repo holds every module and data file, and works outside the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# source folder -> where it lands in the wheel
MAPPING = {"toolkit": "dstk", "models": "dstk/models", "templates": "dstk/templates"}


def _expected_files() -> set[str]:
    expected = set()
    for src, dst in MAPPING.items():
        for path in (ROOT / src).rglob("*"):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            rel = path.relative_to(ROOT / src)
            if src == "toolkit" and rel.parts[0] in ("..",):
                continue
            if path.name == ".keep":
                continue
            expected.add(f"{dst}/{rel.as_posix()}")
    return expected


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    (whl,) = out.glob("dstk-*.whl")
    return whl


@pytest.mark.slow
def test_wheel_contains_every_source_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_expected_files() - names)
    assert not missing, f"missing from the wheel (add the package to pyproject.toml): {missing[:20]}"


@pytest.mark.slow
def test_wheel_runs_outside_the_checkout(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        text=True,
    )
    env = dict(os.environ, PYTHONPATH=str(target))
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    where = subprocess.run(
        [sys.executable, "-c", "import dstk, dstk.models, dstk.templates; print(dstk.__file__)"],
        cwd=cwd, env=env, capture_output=True, text=True, check=True,
    )
    assert where.stdout.strip().startswith(str(target)), where.stdout
    script = target / "bin" / "dstk"
    result = subprocess.run([sys.executable, str(script), "--help"], cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "COMMAND" in result.stdout
