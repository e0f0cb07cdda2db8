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


@pytest.mark.slow
def test_core_install_runs_the_fast_commands_without_the_training_stack(wheel, tmp_path):
    """``pip install dstk`` (no extra) in a fresh virtualenv: validate, plan, generate and estimate
    work with no torch, DeepSpeed or transformers installed; finetune says in one line what to add."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    py = venv / "bin" / "python"
    install = subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True,
                             timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]
    for heavy in ("torch", "deepspeed", "transformers", "datasets", "accelerate"):
        probe = subprocess.run([str(py), "-c", f"import {heavy}"], capture_output=True, text=True, timeout=120)
        assert probe.returncode != 0, f"the core install pulled in {heavy}"
    dstk = [str(venv / "bin" / "dstk")]
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    intent = ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(dstk + list(argv), cwd=cwd, capture_output=True, text=True, timeout=300)

    plan = run("plan", str(intent))
    assert plan.returncode == 0, plan.stderr
    gen = run("generate", str(intent), "--output", str(tmp_path / "run"))
    assert gen.returncode == 0, gen.stderr
    val = run("validate", str(tmp_path / "run" / "ds_config.json"), "--world-size", "2")
    assert val.returncode == 0, val.stdout + val.stderr
    est = run("estimate", "--intent", str(intent), "--format", "json")
    assert est.returncode == 0, est.stderr
    ft = run("finetune", "--plan", str(tmp_path / "run"), "--data", str(intent), "--output", str(tmp_path / "ft"))
    assert ft.returncode == 1, ft.stdout + ft.stderr
    assert "dstk[train]" in ft.stderr and "Traceback" not in ft.stderr, ft.stderr
    assert not (tmp_path / "ft").exists()
