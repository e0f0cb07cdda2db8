"""Damaged checkpoints and copied run directories (issue 15, hardening):

- a truncated or 0-byte checkpoint file and a 0-byte ``config.json``: `dstk export` and
  `dstk finetune --resume` exit 1 with a message naming the file and the previous complete checkpoint,
  before any rank starts (no rank tracebacks); following the hint works;
- a ``latest`` tag pointing outside the checkpoint directory is refused;
- a copied run directory resumes into itself: the original stays byte for byte as it was.

The unit tests build torch/safetensors files directly; the distributed ones share one real tiny
`dstk finetune` run (2 CPU ranks, 4 steps, a checkpoint every 2) and damage copies of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dstk.errors import DstkError
from dstk.train import integrity
from tests.procs import run_group

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"
CORPUS = ROOT / "templates" / "corpus" / "harbour-notes.txt"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _truncate(path: Path, fraction: float = 0.5) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(int(size * fraction))


# --- unit: the file checks -----------------------------------------------------------------------------

def test_torch_files_whole_truncated_and_empty(tmp_path):
    import torch

    good = tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"module": {"w": torch.arange(50_000.0)}}, good)
    assert integrity.file_problem(good) is None
    for fraction in (0.99, 0.5, 0.01, 1 - 1 / good.stat().st_size):
        cut = tmp_path / f"cut-{fraction}.pt"
        shutil.copy(good, cut)
        _truncate(cut, fraction)
        problem = integrity.file_problem(cut)
        assert problem is not None and "truncated" in problem, (fraction, problem)
        with pytest.raises(Exception):  # what torch itself says about the same file
            torch.load(cut, weights_only=False)
    empty = tmp_path / "empty.pt"
    empty.touch()
    assert integrity.file_problem(empty) == "is empty (0 bytes)"


def test_safetensors_and_json(tmp_path):
    import torch
    from safetensors.torch import save_file

    good = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(1000)}, str(good))
    assert integrity.file_problem(good) is None
    _truncate(good, 0.9)
    assert "truncated" in integrity.file_problem(good)
    cfg = tmp_path / "config.json"
    cfg.write_text("")
    assert integrity.file_problem(cfg) == "is empty (0 bytes)"
    cfg.write_text('{"model_type": ')
    assert "not valid JSON" in integrity.file_problem(cfg)


def _fake_checkpoints(root: Path, steps=(2, 4)) -> Path:
    import torch

    from dstk.train.checkpoint import MARKER, tag_for

    ck = root / "checkpoints"
    for step in steps:
        tag = ck / tag_for(step)
        tag.mkdir(parents=True)
        torch.save({"module": {"w": torch.ones(10_000)}}, tag / "mp_rank_00_model_states.pt")
        (tag / MARKER).write_text(json.dumps({"step": step}))
    (ck / "latest").write_text(tag_for(steps[-1]))
    return ck


@pytest.mark.parametrize("latest", ["../elsewhere", "/etc", "..", "."])
def test_latest_outside_the_checkpoint_directory_is_refused(tmp_path, latest):
    ck = _fake_checkpoints(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (ck / "latest").write_text(latest + "\n")
    with pytest.raises(DstkError, match="outside the checkpoint directory"):
        integrity.resolve_tag(ck)
    with pytest.raises(DstkError, match="outside the checkpoint directory"):
        integrity.check_export(ck, tag=None, config=None)


def test_export_command_refuses_a_latest_outside_with_exit_1(tmp_path, capsys):
    from dstk.cli import main

    ck = _fake_checkpoints(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (ck / "latest").write_text("../elsewhere")
    assert main(["export", str(ck), "--output", str(tmp_path / "hf")]) == 1
    err = capsys.readouterr().err
    assert f"{ck / 'latest'} names '../elsewhere', which lies outside the checkpoint directory" in err, err
    assert "Traceback" not in err and not (tmp_path / "hf").exists()


def test_a_tag_symlinked_outside_is_refused_and_a_plain_one_accepted(tmp_path):
    ck = _fake_checkpoints(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (ck / "step-000009").symlink_to(outside)
    with pytest.raises(DstkError, match="resolves to"):
        integrity.resolve_tag(ck, "step-000009")
    assert integrity.resolve_tag(ck) == ck / "step-000004"
    integrity.check_export(ck, tag=None, config=None)  # whole: no error


def test_export_check_names_the_file_and_the_previous_complete_checkpoint(tmp_path):
    ck = _fake_checkpoints(tmp_path, steps=(2, 4, 6))
    bad = ck / "step-000006" / "mp_rank_00_model_states.pt"
    _truncate(bad)
    _truncate(ck / "step-000004" / "mp_rank_00_model_states.pt", 0)  # the one before is damaged too
    with pytest.raises(DstkError) as err:
        integrity.check_export(ck, tag=None, config=None, output="hf")
    assert str(bad) in err.value.args[0] and "truncated" in err.value.args[0]
    assert err.value.hint == f"export the previous complete checkpoint: dstk export {ck} --tag step-000002 --output hf"
    # the one before the damaged tag, not a newer one
    _truncate(bad, 1.0)
    shutil.rmtree(ck / "step-000006")
    _fake_checkpoints(tmp_path, steps=(6,))
    with pytest.raises(DstkError) as err:
        integrity.check_export(ck, tag="step-000004", config=None, output="hf")
    assert "--tag step-000002 " in err.value.hint, err.value.hint


def test_a_copied_run_directory_is_rebased_and_the_original_untouched(tmp_path):
    orig = tmp_path / "orig"
    (orig / "prepared").mkdir(parents=True)
    spec = {"output_dir": str(orig.resolve()), "train_blocks": str(orig.resolve() / "prepared" / "train.pt"),
            "run_dir": "/somewhere/else/plan", "eval_blocks": None}
    (orig / "finetune.json").write_text(json.dumps(spec))
    (orig / "ds_config.json").write_text(json.dumps({"csv_monitor": {"output_path": str(orig.resolve() / "logs")}}))
    before = _hashes(orig)
    copy = tmp_path / "copy"
    shutil.copytree(orig, copy)
    assert integrity.rebase_run(copy) == str(orig.resolve())
    rebased = json.loads((copy / "finetune.json").read_text())
    assert rebased["output_dir"] == str(copy.resolve())
    assert rebased["train_blocks"] == str(copy.resolve() / "prepared" / "train.pt")
    assert rebased["run_dir"] == "/somewhere/else/plan"  # outside the run: kept
    assert json.loads((copy / "ds_config.json").read_text())["csv_monitor"]["output_path"] == str(copy.resolve() / "logs")
    assert _hashes(orig) == before
    assert integrity.rebase_run(copy) is None  # now at home


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# --- distributed: one real tiny run, damaged copies of it ------------------------------------------------

def _dstk(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run dstk in its own session; on a timeout kill the whole group (the runner and its ranks too)."""
    return run_group([sys.executable, "-m", "dstk", *args], env=ENV, cwd=ROOT, timeout=timeout)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("integrity")
    done = _dstk("generate", str(EXAMPLE), "--precision", "fp32", "--output", str(root / "plan"), timeout=120)
    assert done.returncode == 0, done.stderr
    done = _dstk("finetune", "--plan", str(root / "plan"), "--data", str(CORPUS), "--output", str(root / "run"),
                 "--steps", "4", "--save-every", "2", timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (root / "run" / "checkpoints" / "step-000002").is_dir() and (root / "run" / "checkpoints" / "step-000004").is_dir()
    return root / "run"


def _copy(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(run, copy, symlinks=True)
    return copy


def _model_states(run: Path, step: int) -> Path:
    [path] = (run / "checkpoints" / f"step-{step:06d}").glob("*mp_rank_00_model_states.pt")
    return path


def _no_ranks(out: str) -> None:
    assert "Traceback" not in out and "[rank" not in out, out[-3000:]


@pytest.mark.distributed
@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_export_of_a_damaged_checkpoint_names_the_file_and_the_hint_works(finished_run, tmp_path, damage):
    copy = _copy(finished_run, tmp_path)
    bad = _model_states(copy, 4)
    _truncate(bad, 0.5 if damage == "truncated" else 0)
    done = _dstk("export", str(copy / "checkpoints"), "--output", str(tmp_path / "hf"))
    assert done.returncode == 1, done.stdout + done.stderr
    _no_ranks(done.stderr)
    assert str(bad) in done.stderr and ("truncated" if damage == "truncated" else "0 bytes") in done.stderr
    hint = f"dstk export {copy / 'checkpoints'} --tag step-000002 --output {tmp_path / 'hf'}"
    assert hint in done.stderr, done.stderr
    done = _dstk(*hint.split()[1:])
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "hf" / "config.json").is_file()


@pytest.mark.distributed
def test_export_with_an_empty_config_json_names_it(finished_run, tmp_path):
    copy = _copy(finished_run, tmp_path)
    (copy / "model" / "config.json").write_text("")
    done = _dstk("export", str(copy / "checkpoints"), "--output", str(tmp_path / "hf"))
    assert done.returncode == 1, done.stdout + done.stderr
    _no_ranks(done.stderr)
    assert f"the HF config {copy / 'model' / 'config.json'} is empty (0 bytes)" in done.stderr, done.stderr
    assert f"--config {copy / 'prepared' / 'model_config'}" in done.stderr, done.stderr


@pytest.mark.distributed
def test_resume_refuses_a_latest_outside_and_an_empty_settings_file(finished_run, tmp_path):
    copy = _copy(finished_run, tmp_path)
    (copy / "checkpoints" / "latest").write_text("../../elsewhere")
    done = _dstk("finetune", "--resume", "--output", str(copy))
    assert done.returncode == 1 and "outside the checkpoint directory" in done.stderr, done.stderr
    _no_ranks(done.stderr)
    (copy / "checkpoints" / "latest").write_text("step-000004")
    (copy / "ds_config.json").write_text("")
    done = _dstk("finetune", "--resume", "--output", str(copy))
    assert done.returncode == 1 and f"{copy / 'ds_config.json'} is empty (0 bytes)" in done.stderr, done.stderr
    _no_ranks(done.stderr)


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_a_copied_run_with_a_damaged_checkpoint_resumes_into_itself(finished_run, tmp_path):
    """Damage the copy's newest checkpoint: resume names it and the previous one, before any rank
    starts; following the hint, the copy resumes from step 2 into itself; the original is untouched."""
    before = _hashes(finished_run)
    copy = _copy(finished_run, tmp_path)
    bad = _model_states(copy, 4)
    _truncate(bad)
    done = _dstk("finetune", "--resume", "--output", str(copy))
    assert done.returncode == 1, done.stdout + done.stderr
    _no_ranks(done.stderr)
    assert str(bad) in done.stderr and "truncated" in done.stderr, done.stderr
    step4, step2 = copy / "checkpoints" / "step-000004", copy / "checkpoints" / "step-000002"
    assert f"resume from the previous complete checkpoint {step2}" in done.stderr, done.stderr
    aside = step4.with_name("damaged-step-000004")
    assert f"mv {step4} {aside}" in done.stderr
    assert f"copied from {finished_run.resolve()}" in done.stderr  # rebased onto the copy, then checked
    step4.rename(aside)
    done = _dstk("finetune", "--resume", "--output", str(copy), timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((copy / "summary.json").read_text())
    assert summary["start_step"] == 2 and summary["steps"] == 4, summary
    assert (step4 / "dstk_complete.json").is_file() and integrity.tag_problems(step4) == []
    assert str(copy.resolve()) in summary["export_dir"]
    assert json.loads((copy / "finetune.json").read_text())["output_dir"] == str(copy.resolve())
    assert _hashes(finished_run) == before  # byte for byte
