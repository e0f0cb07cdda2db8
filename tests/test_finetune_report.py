"""`dstk finetune --report-to csv|tensorboard|wandb`: DeepSpeed's monitor blocks writing under OUTPUT/logs,
a missing package refused with the pip command, and real runs (native loop and --trainer hf) whose csv
holds the loss of every step."""

from __future__ import annotations

import csv
import importlib.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dstk.errors import DstkError, UsageError
from dstk.train.logs import check_report_to, monitor_blocks, parse_report_to, wandb_env
from dstk.train.prepare import effective_config

ROOT = Path(__file__).resolve().parents[1]


def test_report_to_is_a_comma_list_of_known_backends():
    assert parse_report_to(None) == ("csv",)
    assert parse_report_to("none") == ()
    assert parse_report_to("tensorboard, CSV,tensorboard") == ("tensorboard", "csv")
    for bad in ("mlflow", "csv,comet", ","):
        with pytest.raises(UsageError) as err:
            parse_report_to(bad)
        assert "csv, tensorboard, wandb" in err.value.hint


def test_a_missing_package_is_refused_with_the_pip_command():
    check_report_to(("csv",), find=lambda name: None)  # csv needs nothing
    with pytest.raises(DstkError) as err:
        check_report_to(("csv", "tensorboard", "wandb"), find=lambda name: None)
    assert "tensorboard wandb is not installed" in str(err.value)
    assert f"{sys.executable} -m pip install tensorboard wandb" in err.value.hint
    check_report_to(("tensorboard", "wandb"), find=lambda name: object())


def test_the_monitor_blocks_write_under_the_logs_directory_and_deepspeed_accepts_them():
    from deepspeed.monitor.config import get_monitor_config

    blocks = monitor_blocks(("csv", "tensorboard", "wandb"), logs_dir="/r/logs")
    assert blocks == {"csv_monitor": {"enabled": True, "output_path": "/r/logs", "job_name": "csv"},
                      "tensorboard": {"enabled": True, "output_path": "/r/logs", "job_name": "tensorboard"},
                      "wandb": {"enabled": True, "project": "dstk-finetune"}}
    parsed = get_monitor_config(blocks)  # DeepSpeed's own model of these blocks (extra keys are refused)
    assert parsed.enabled and parsed.csv_monitor.output_path == "/r/logs" and parsed.wandb.project == "dstk-finetune"
    assert monitor_blocks((), logs_dir="/r/logs") == {}
    out, _ = effective_config({"train_batch_size": 8}, num_steps=10, metrics_dir="/r/logs", report_to=())
    assert "csv_monitor" not in out and "tensorboard" not in out


def test_wandb_is_offline_under_the_logs_unless_the_user_said_otherwise():
    assert wandb_env(logs_dir="/r/logs", environ={}) == {"WANDB_MODE": "offline", "WANDB_DIR": "/r/logs"}
    assert wandb_env(logs_dir="/r/logs", environ={"WANDB_MODE": "online", "WANDB_DIR": "/w"}) == {}


def _env(**extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _finetune(out: Path, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess:
    data = ROOT / "templates" / "corpus" / "harbour-notes.txt"
    from tests.procs import run_group

    return run_group([sys.executable, "-m", "dstk.cli", "finetune", "--model", "tiny-llama", "--data", str(data),
                      "--gpus", "2", "--zero", "2", "--output", str(out), "--steps", "12", *extra],
                     env=_env(), cwd=ROOT, timeout=timeout)


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_finetune_refuses_a_backend_it_cannot_load_before_preparing_anything(tmp_path):
    proc = _finetune(tmp_path / "out", "--report-to", "csv,wandb", timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "wandb is not installed" in proc.stderr and "pip install wandb" in proc.stderr
    assert not (tmp_path / "out").exists()


def _rows(path: Path) -> list[tuple[int, float]]:
    return [(int(r[0]), float(r[1])) for r in csv.reader(io.StringIO(path.read_text())) if r and r[0] != "step"]


@pytest.mark.distributed
def test_csv_has_the_loss_of_every_step_the_progress_lines_show(tmp_path):
    out = tmp_path / "out"
    proc = _finetune(out, "--report-to", "csv", "--log-every", "1")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    logs = out / "logs"
    rows = _rows(logs / "csv" / "Train_loss.csv")
    assert [s for s, _ in rows] == list(range(1, 13))
    shown = {int(s): float(v) for s, v in re.findall(r"\] (\d+)/12 loss ([\d.]+)", proc.stdout)}
    assert shown.keys() == set(range(1, 13))
    assert all(abs(shown[s] - loss) < 5e-5 for s, loss in rows)  # the same figure, printed to 4 decimals
    assert [s for s, _ in _rows(logs / "csv" / "Train_lr.csv")] == list(range(1, 13))
    assert (logs / "launch.log").is_file() and not (out / "metrics").exists()


@pytest.mark.distributed
def test_the_trainer_reports_its_loss_to_csv_through_deepspeeds_monitor(tmp_path):
    out = tmp_path / "out"
    proc = _finetune(out, "--trainer", "hf", "--report-to", "csv", "--log-every", "5")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = _rows(out / "logs" / "csv" / "Train_loss.csv")
    assert [s for s, _ in rows] == [1, 5, 10, 12]  # every --log-every steps, and the first and last
    assert re.findall(r"\] (\d+)/12 loss", proc.stdout) == ["1", "5", "10", "12"]
    assert "{'loss'" not in proc.stdout  # the Trainer's own dict printer is replaced by the progress line


@pytest.mark.distributed
@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed")
@pytest.mark.parametrize("trainer", ["native", "hf"])
def test_tensorboard_event_files_hold_the_loss(tmp_path, trainer):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "out"
    proc = _finetune(out, "--trainer", trainer, "--report-to", "tensorboard", "--log-every", "1")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    runs = {p.parent for p in (out / "logs" / "tensorboard").rglob("events.out.tfevents.*")}
    tags = {}
    for run in runs:
        acc = EventAccumulator(str(run))
        acc.Reload()
        tags.update({tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]})
    loss_tag = "Train/loss" if trainer == "native" else "train/loss"
    assert tags.get(loss_tag) == list(range(1, 13)), tags
    assert not (out / "logs" / "csv").exists()
