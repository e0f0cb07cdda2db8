"""Preemption loses nothing: a stop signal saves a checkpoint at the step reached, and a resume's metrics go on.

Slurm sends SIGTERM to every process of a job at preemption or at its time limit (SIGKILL follows KillWait
later, 30 s by default), or a chosen signal N s before the limit (``--signal=USR1@N``); DeepSpeed's launch.py
passes SIGTERM to its ranks one after the other and SIGKILLs after 30 s. ``dstk finetune``'s ranks
(``dstk.train.worker.StopRequest``) note SIGTERM or SIGUSR1, agree after the step (one all-reduce, MAX),
save the normal complete-or-absent checkpoint, say the step and the save time, and exit 128 + the signal;
the parent names the checkpoint and the resume command. ``--resume`` drops the csv rows past the checkpoint
(``dstk.train.logs.trim_csv_metrics``) and writes no second header.

The real runs: 2 CPU ranks of a tiny Llama with a tokenizer of its own (tests/test_audit_run.py's model),
stopped the ways a cluster stops them: SIGTERM to dstk (and more SIGTERMs to the ranks while they save), SIGUSR1
to every process of the run (what Slurm's ``--signal=USR1@N`` does to a step), SIGTERM to one rank only.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dstk.train import checkpoint as ckpt
from dstk.train.logs import RunSink, trim_csv_metrics
from dstk.train.worker import StopRequest, stop_line
from tests.launch_support import cmdlines, hangup_default, run_env, save_tiny_hf_model

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "templates" / "corpus" / "harbour-notes.txt"
STEPS = 400
STOP_AT = 20
"""The ranks are stopped once rank 0 printed this step (a tiny model trains ~10 steps a second here)."""
END_SECONDS = 100
"""From the stop to the end of the run: a step, a save of a tiny model and the exit take seconds; launch.py
and dstk SIGKILL what is left 30 s after their SIGTERM."""


# --- fast ----------------------------------------------------------------------------------------------------


def test_a_stop_request_keeps_the_first_signal_and_its_time():
    stop = StopRequest()
    assert stop.signum == 0 and stop.monotonic_seconds is None
    stop(signal.SIGUSR1, None)
    first = stop.monotonic_seconds
    stop(signal.SIGTERM, None)  # dstk, the rank wrapper and launch.py each pass a SIGTERM on
    assert stop.signum == signal.SIGUSR1 and stop.monotonic_seconds == first


def test_the_stop_line_says_the_step_the_save_time_and_when_it_is_too_long():
    line = stop_line(signum=signal.SIGTERM, step=22, num_steps=400, checkpoint="out/checkpoints/step-000022",
                     save_seconds=0.04, since_signal_seconds=1.3)
    assert line.startswith("dstk: SIGTERM reached the ranks: saved the checkpoint of step 22 of 400 "
                           "(out/checkpoints/step-000022); the save took 0.04 s, 1.3 s after the signal")
    assert "within the 30 s" in line and "LONGER" not in line
    slow = stop_line(signum=signal.SIGUSR1, step=7, num_steps=9, checkpoint="c", save_seconds=41.0,
                     since_signal_seconds=None)
    assert "SIGUSR1 reached the ranks" in slow and "after the signal" not in slow
    assert "LONGER than the 30 s" in slow and "#SBATCH --signal=USR1@82" in slow
    # the time since the signal counts, not the save alone: a long step eats the grace too
    assert "LONGER" in stop_line(signum=15, step=1, num_steps=2, checkpoint="c", save_seconds=2.0,
                                 since_signal_seconds=31.0)
    sink = RunSink(log=None, verbose=False, live=False, out=io.StringIO(), err=io.StringIO())
    sink("stdout", "[rank 1] " + line + "\n")
    assert not sink.saved_on_signal  # rank 0's line only
    sink("stdout", line + "\n")
    assert not sink.saved_on_signal  # a line without the rank wrapper's prefix is no rank's
    sink("stdout", "node-b: [rank 0] " + line + "\n")  # behind pdsh's prefix
    assert sink.saved_on_signal


def _csv(path: Path, text: str) -> None:
    path.write_text(text.replace("|", "\n"))


def test_trim_keeps_the_rows_up_to_the_checkpoint_and_one_header(tmp_path):
    _csv(tmp_path / "Train_loss.csv", "step,loss|1,5.0|2,4.0|3,3.5|4,3.0|")
    # an older dstk's resume: a second header, steps 3.. again
    _csv(tmp_path / "Train_lr.csv", "step,lr|1,0.1|2,0.2|3,0.3|step,lr|3,0.3|4,0.4|5,0.5|")
    # DeepSpeed's own events count samples (8 a step here), not steps
    _csv(tmp_path / "Train_Samples_lr.csv", "step,lr|8,0.1|16,0.2|24,0.3|32,0.4|")
    _csv(tmp_path / "Eval_loss.csv", "step,loss|2,4.5|")
    changed = trim_csv_metrics(tmp_path, last_step=2, last_samples=16)
    lines = lambda name: (tmp_path / name).read_bytes().decode().splitlines()  # noqa: E731
    assert lines("Train_loss.csv") == ["step,loss", "1,5.0", "2,4.0"]
    assert lines("Train_lr.csv") == ["step,lr", "1,0.1", "2,0.2"]
    assert lines("Train_Samples_lr.csv") == ["step,lr", "8,0.1", "16,0.2"]
    assert (tmp_path / "Eval_loss.csv").read_bytes() == b"step,loss\n2,4.5\n"  # nothing to cut: left as it was
    assert [p.name for p in changed] == ["Train_Samples_lr.csv", "Train_loss.csv", "Train_lr.csv"]
    assert trim_csv_metrics(tmp_path / "none", last_step=1, last_samples=8) == []


def test_the_sbatch_script_asks_for_a_signal_before_the_time_limit_and_says_how_to_requeue():
    from dstk.launch import LaunchSpec
    from dstk.launch.slurm import SIGNAL_SECONDS, render_sbatch

    spec = LaunchSpec(num_nodes=2, gpus_per_node=8, run_dir="/runs/a", script="train.py")
    text = render_sbatch(spec, sbatch_path="/runs/a/launch.sbatch", time="04:00:00")
    lines = text.splitlines()
    assert f"#SBATCH --signal=USR1@{SIGNAL_SECONDS}" in lines and "#SBATCH --time=04:00:00" in lines
    # a directive, so before the first command: sbatch stops reading #SBATCH lines there
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert lines.index(f"#SBATCH --signal=USR1@{SIGNAL_SECONDS}") < first_command
    assert "#SBATCH --requeue" in text and "dstk finetune --resume --output OUT" in text  # the guidance
    assert "#SBATCH --signal=USR1@300" in render_sbatch(spec, sbatch_path="/x", signal_seconds=300).splitlines()
    from dstk.errors import DstkError

    with pytest.raises(DstkError):
        render_sbatch(spec, sbatch_path="/x", signal_seconds=0)


def test_a_slurm_node_keeps_sigusr1_from_all_but_the_ranks():
    """``python -m dstk.launch.slurm`` ignores SIGUSR1, and what it starts inherits that: the runner, launch.py
    and the rank wrappers die of it otherwise (Slurm's ``--signal=USR1@N`` reaches every process of the step)."""
    probe = "import signal; print('ignored', signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN)"
    done = subprocess.run([sys.executable, "-m", "dstk.launch.slurm", "--ranks", "1", "--", sys.executable, "-c",
                           probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert "ignored True" in done.stdout, done.stdout + done.stderr


# --- real runs: 2 CPU ranks ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> Path:
    """A tiny Llama saved with save_pretrained, with a tokenizer of its own."""
    return save_tiny_hf_model(tmp_path_factory.mktemp("hf-model"))


def _env() -> dict:
    return run_env()


def _argv(out: Path, model: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "dstk.cli", "finetune", "--model", str(model), "--data", str(CORPUS), "--gpus", "2",
            "--zero", "2", "--output", str(out), "--steps", str(STEPS), "--log-every", "1", *extra]


def workers(out: Path) -> dict[int, int]:
    """{rank: pid} of the run's ``dstk.train.worker`` or ``dstk.train.hf_worker`` processes (not their rank wrappers, whose command line
    names the worker too)."""
    spec = str(out.resolve() / "finetune.json")
    found = {}
    for pid, cmd in cmdlines().items():
        args = cmd.split(" ")
        if ("dstk.train.worker" in args or "dstk.train.hf_worker" in args) and spec in args and "dstk.launch.rank" not in args:
            m = re.search(r"--local_rank=(\d+)", cmd)
            if m:
                found[int(m.group(1))] = pid
    return found


def _stop_at(argv: list[str], *, stop, out: Path) -> tuple[int, str]:
    """Start ``dstk finetune`` in a session of its own, read its output until rank 0's progress line of
    ``STOP_AT`` or later, call ``stop(proc)``, and return (exit code, everything it printed)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=ROOT,
                            start_new_session=True, preexec_fn=hangup_default)
    text = ""
    try:
        for line in proc.stdout:
            text += line
            m = re.search(rf" (\d+)/{STEPS} loss", line)
            if m and int(m.group(1)) >= STOP_AT:
                break
        assert proc.poll() is None and len(workers(out)) == 2, text[-4000:]
        stop(proc)
        rest: list[str] = []
        reader = threading.Thread(target=lambda: rest.extend(proc.stdout), daemon=True)
        reader.start()
        reader.join(timeout=END_SECONDS)
        assert not reader.is_alive(), (f"the run did not end {END_SECONDS} s after the stop (ranks left in a "
                                       f"collective?)\n" + (text + "".join(rest))[-4000:])
        return proc.wait(timeout=30), text + "".join(rest)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _saved(text: str, signame: str) -> int:
    """The step of rank 0's stop line, checked against the checkpoints on disk."""
    m = re.search(rf"\[rank 0\] dstk: {signame} reached the ranks: saved the checkpoint of step (\d+) of {STEPS} "
                  rf"\((.+?)\); the save took ([\d.]+) s", text)
    assert m, text[-4000:]
    step = int(m.group(1))
    assert step >= STOP_AT and m.group(2).endswith(f"checkpoints/{ckpt.tag_for(step)}"), text[-4000:]
    print(f"{signame}: saved step {step}, the save took {m.group(3)} s")
    return step


def _check_checkpoint(out: Path, step: int) -> None:
    root = out / "checkpoints"
    assert ckpt.newest_complete(root) == (step, ckpt.tag_for(step))
    assert not list(root.glob(".tmp-*"))
    tag = root / ckpt.tag_for(step)
    assert {p.name for p in tag.glob("dstk_rng_rank*.pt")} == {"dstk_rng_rank0.pt", "dstk_rng_rank1.pt"}
    assert len(list(tag.glob("*optim_states.pt"))) == 2  # ZeRO-2: each rank's optimizer partition


def _rows(path: Path) -> tuple[list[list[str]], list[int]]:
    rows = list(csv.reader(io.StringIO(path.read_text())))
    return [r for r in rows if r and r[0] == "step"], [int(r[0]) for r in rows if r and r[0] != "step"]


def _keep_terming(out: Path, done: threading.Event) -> None:
    """More SIGTERMs to every rank while they save (what launch.py, the rank wrapper and a second scancel add)."""
    while not done.is_set():
        for pid in workers(out).values():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_sigterm_saves_the_step_reached_then_resume_finishes_with_each_step_once(hf_model, tmp_path):
    """SIGTERM to dstk (``kill``, or Slurm at preemption) once step 20 printed, no --save-every: a complete
    checkpoint of the step the ranks reached, rank 0's line with the save time, the parent's resume command,
    exit 143 and no failure tail; SIGTERMs keep reaching the ranks during the save and change nothing. Then
    ``--resume`` trains the rest: 400 steps in all, and every csv file holds each step once under one header."""
    out = tmp_path / "out"
    done = threading.Event()
    terms = threading.Thread(target=_keep_terming, args=(out, done), daemon=True)

    def stop(proc):
        proc.send_signal(signal.SIGTERM)
        terms.start()

    try:
        rc, text = _stop_at(_argv(out, hf_model), stop=stop, out=out)
    finally:
        done.set()
    assert rc == 143, text[-4000:]
    step = _saved(text, "SIGTERM")
    assert "s after the signal reached rank 0: within the 30 s" in text, text[-4000:]
    assert (f"dstk: the newest complete checkpoint is step {step} of {STEPS} ({out}/checkpoints/{ckpt.tag_for(step)}); "
            f"`dstk finetune --resume --output {out}` goes on from step {step + 1}\n") in text, text[-4000:]
    assert "the last 20 lines" not in text and "Traceback" not in text, text[-4000:]
    _check_checkpoint(out, step)
    headers, steps = _rows(out / "logs" / "csv" / "Train_loss.csv")
    assert len(headers) == 1 and steps == list(range(1, step + 1))

    resumed = subprocess.run([sys.executable, "-m", "dstk.cli", "finetune", "--output", str(out), "--resume"],
                             capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"(step {step}); continuing at step {step + 1}" in resumed.stdout, resumed.stdout[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["start_step"] == step
    for name in ("Train_loss", "Train_lr", "Train_tokens_per_second"):
        headers, steps = _rows(out / "logs" / "csv" / f"{name}.csv")
        assert len(headers) == 1 and steps == list(range(1, STEPS + 1)), (name, headers, steps[:5], steps[-5:])
    headers, samples = _rows(out / "logs" / "csv" / "Train_Samples_lr.csv")  # DeepSpeed's own, by sample
    assert len(headers) == 1 and samples == [8 * s for s in range(1, STEPS + 1)], (samples[:5], samples[-5:])


@pytest.mark.distributed
@pytest.mark.timeout(400)
def test_sigusr1_to_every_process_of_the_run_saves_as_slurms_signal_does(hf_model, tmp_path):
    """SIGUSR1 to every process of the run (Slurm's ``--signal=USR1@N`` signals every process of a step): dstk,
    the runner, launch.py and the wrappers ignore it, the ranks save and exit 138 (128 + SIGUSR1)."""
    out = tmp_path / "out"
    rc, text = _stop_at(_argv(out, hf_model), stop=lambda proc: os.killpg(proc.pid, signal.SIGUSR1), out=out)
    assert rc == 128 + signal.SIGUSR1, text[-4000:]
    step = _saved(text, "SIGUSR1")
    _check_checkpoint(out, step)
    assert f"goes on from step {step + 1}" in text and "the last 20 lines" not in text, text[-4000:]


@pytest.mark.distributed
@pytest.mark.timeout(400)
def test_sigterm_to_one_rank_stops_both_at_the_same_step(hf_model, tmp_path):
    """SIGTERM to rank 1's process alone (launch.py reaches its ranks one after the other; ``kill`` one): rank 0
    learns it through the all-reduce after the step, both save that step and exit; a rank saving alone would
    leave the other in the next step's collectives."""
    out = tmp_path / "out"
    rc, text = _stop_at(_argv(out, hf_model), out=out,
                        stop=lambda proc: os.kill(workers(out)[1], signal.SIGTERM))
    assert rc == 143, text[-4000:]
    step = _saved(text, "SIGTERM")
    assert "after the signal reached rank 0" not in text, text[-4000:]  # rank 0 got no signal itself
    _check_checkpoint(out, step)


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_a_pipeline_stops_both_stages_at_the_same_step_when_one_stage_gets_sigterm(hf_model, tmp_path):
    """pp=2 (DeepSpeed's pipeline engine, one stage per rank): SIGTERM to the last stage's rank alone; the
    first stage learns it through the same all-reduce after ``train_batch``, both stages save that step (each
    its own layers and optimizer partition) and exit 143 with the resume command."""
    out = tmp_path / "out"
    argv = _argv(out, hf_model, "--pp", "2")
    i = argv.index("--zero")
    del argv[i:i + 2]  # ZeRO-2 cannot run under a pipeline: the plan's own stage
    rc, text = _stop_at(argv, out=out, stop=lambda proc: os.kill(workers(out)[1], signal.SIGTERM))
    assert rc == 143, text[-4000:]
    step = _saved(text, "SIGTERM")
    root = out / "checkpoints"
    assert ckpt.newest_complete(root) == (step, ckpt.tag_for(step)) and not list(root.glob(".tmp-*"))
    tag = root / ckpt.tag_for(step)
    assert {p.name for p in tag.glob("dstk_rng_rank*.pt")} == {"dstk_rng_rank0.pt", "dstk_rng_rank1.pt"}
    assert len(list(tag.glob("layer_*-model_states.pt"))) >= 2, sorted(p.name for p in tag.iterdir())
    assert f"goes on from step {step + 1}" in text and "the last 20 lines" not in text, text[-4000:]


@pytest.mark.distributed
@pytest.mark.timeout(900)
def test_the_hf_trainer_saves_on_sigterm_and_its_resume_finishes_with_each_step_once(hf_model, tmp_path):
    """``--trainer hf``: the same stop through transformers' Trainer (``dstk.train.hf_worker._stopping``): SIGTERM
    to dstk once step 20 printed, the Trainer's ``checkpoint-N`` of the step the ranks agreed on, complete
    (``trainer_state.json``), rank 0's stop line, exit 143 and the resume command; ``--resume`` trains the rest
    and the csv loss holds each step once under one header."""
    out = tmp_path / "out"
    rc, text = _stop_at(_argv(out, hf_model, "--trainer", "hf"), stop=lambda proc: proc.send_signal(signal.SIGTERM),
                        out=out)
    assert rc == 143, text[-4000:]
    m = re.search(rf"\[rank 0\] dstk: SIGTERM reached the ranks: saved the checkpoint of step (\d+) of {STEPS} "
                  rf"\((.+?)\); the save took ([\d.]+) s", text)
    assert m and m.group(2).endswith(f"checkpoints/checkpoint-{m.group(1)}"), text[-4000:]
    step = int(m.group(1))
    print(f"hf trainer: saved step {step}, the save took {m.group(3)} s")
    assert step >= STOP_AT and ckpt.newest_hf_trainer(out / "checkpoints") == step
    assert (f"the newest complete checkpoint is step {step} of {STEPS} ({out}/checkpoints/checkpoint-{step}); "
            f"`dstk finetune --resume --output {out}` goes on from step {step + 1}") in text, text[-4000:]
    assert "the last 20 lines" not in text and "Traceback" not in text, text[-4000:]
    assert not (out / "summary.json").exists()

    resumed = subprocess.run([sys.executable, "-m", "dstk.cli", "finetune", "--output", str(out), "--resume"],
                             capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer"] == "hf" and summary["steps"] == STEPS
    headers, steps = _rows(out / "logs" / "csv" / "Train_loss.csv")
    assert len(headers) == 1 and steps == list(range(1, STEPS + 1)), (headers, steps[:5], steps[-5:])


# --- a real Slurm job (a single-node slurmctld/slurmd, tests/services.py) ----------------------------------------

WAITER = """\
import os, signal, time
got = []
signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
print("waiting", flush=True)
deadline = time.monotonic() + 120
while not got and time.monotonic() < deadline:
    time.sleep(0.1)
print("got SIGUSR1" if got else "no signal", flush=True)
"""


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_sigusr1_to_a_slurm_jobs_steps_reaches_the_ranks_and_stops_nothing_else(tmp_path):
    """What ``#SBATCH --signal=USR1@N`` does N s before the time limit, sent now (``scancel --signal=USR1``: every
    process of the job's steps, not the batch shell): the judge, the runner, launch.py and the rank wrappers of the
    script ``dstk launch --slurm`` wrote ignore it, each rank's handler gets it, and the job completes. Without
    ``dstk.launch.slurm`` ignoring it they die of it (SIGUSR1's default action) and the job fails."""
    from tests.services import Unavailable, generate_tiny_run, start_slurm

    try:
        slurm = start_slurm(tmp_path / "slurm")
    except Unavailable as exc:
        pytest.skip(f"no Slurm cluster: {exc}")
    try:
        (tmp_path / "gen").mkdir()
        run_dir = generate_tiny_run(tmp_path / "gen", repo=ROOT)
        script, sbatch, log = tmp_path / "waiter.py", tmp_path / "wait.sbatch", tmp_path / "wait.out"
        script.write_text(WAITER)
        env = {**os.environ, **slurm.env}
        subprocess.run([sys.executable, "-m", "dstk", "launch", str(run_dir), "--slurm", "--partition", slurm.partition,
                        "--sbatch-out", str(sbatch), "--", str(script)], check=True, capture_output=True, env=env,
                       cwd=ROOT, timeout=60)
        assert "#SBATCH --signal=USR1@120" in sbatch.read_text().splitlines()
        job_id = subprocess.run(["sbatch", "--parsable", f"--output={log}", str(sbatch)], check=True,
                                capture_output=True, text=True, env=env, cwd=tmp_path, timeout=30).stdout.strip()
        job_id = job_id.split(";")[0]
        deadline = time.monotonic() + 420
        while not (log.is_file() and log.read_text().count("] waiting") == 2):
            assert time.monotonic() < deadline and slurm.in_queue(job_id), log.read_text() if log.is_file() else job_id
            time.sleep(0.5)
        assert slurm.command("scancel", "--signal=USR1", job_id).returncode == 0
        state = slurm.wait_job(job_id, timeout_seconds=120)
        text = log.read_text()
        assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0"), text[-3000:]
        assert sorted(re.findall(r"^\[rank (\d)\] got SIGUSR1$", text, re.M)) == ["0", "1"], text[-3000:]
    finally:
        slurm.stop()
