"""What a person sees during `dstk finetune`: one progress line redrawn in place on a terminal (a real
pty), a line every --log-every steps in a pipe, DeepSpeed's and torch's INFO/WARNING lines kept in
OUTPUT/logs/launch.log, and after a failure the log's last lines with its path."""

from __future__ import annotations

import io
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dstk.train.logs import RunSink, is_noise, show_tail
from dstk.train.progress import eta_seconds, format_progress, parse_record, progress_record
from tests.procs import run_group

ROOT = Path(__file__).resolve().parents[1]

# Lines as a 2-rank `dstk finetune` printed them (08:18 run on this machine), with what the terminal shows.
REAL_LINES = [
    ("stdout", "[2026-12-03 08:18:35,158] [WARNING] [real_accelerator.py:213:get_accelerator] Setting accelerator "
               "to CPU. If you have GPU or other accelerator, we were unable to detect it.\n", False),
    ("stdout", "[2026-12-03 08:18:36,400] [INFO] [launch.py:152:main] WORLD INFO DICT: {'localhost': [0, 1]}\n", False),
    ("stdout", "[rank 0] [2026-12-03 08:18:44,639] [WARNING] [lr_schedules.py:938:get_lr] Attempting to get "
               "learning rate from scheduler before it has started\n", False),
    ("stdout", "[rank 1] DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully\n", False),
    ("stderr", "[rank 1] /work/main/.venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83: "
               "FutureWarning: `torch.distributed.all_gather_into_tensor` is deprecated.\n", False),
    ("stderr", "[rank 1]   return func(*args, **kwargs)\n", False),
    ("stderr", "[rank 0] [W1203 08:18:44.123456789 ProcessGroupGloo.cpp:514] Warning: unable to find the interface\n",
     False),
    ("stdout", "[2026-12-03 08:18:45,429] [ERROR] [launch.py:321:sigkill_handler] exits with return code 1\n", True),
    ("stderr", "[rank 1] Traceback (most recent call last):\n", True),
    ("stderr", "[rank 1]   File \"/x/worker.py\", line 3, in <module>\n", True),
    ("stderr", "[rank 1] RuntimeError: boom\n", True),
    ("stdout", "[rank 0] trained 12 steps in 0.6 s (22,280 tok/s): loss 6.2519 -> 6.1530\n", True),
    ("stderr", "dstk: rank 1 on host exited with code 1\n", True),
]


def _record(step: int, *, num_steps: int = 12, log: bool = True) -> str:
    return "[rank 0] " + progress_record(step=step, num_steps=num_steps, loss=6.0 - step / 100, tokens_per_second=21234.0,
                                         lr=2.5e-4, elapsed_seconds=0.1 * step, log=log) + "\n"


def test_noise_is_deepspeeds_and_torchs_info_and_warnings_not_errors_or_dstks_lines():
    shown = [line for _, line, show in REAL_LINES if show]
    assert [is_noise(line) for line in shown] == [False] * len(shown)
    # the Python warning's source line is hidden by the sink (it follows its warning), not by is_noise
    hidden = [line for _, line, show in REAL_LINES if not show and "return func" not in line]
    assert all(is_noise(line) for line in hidden)
    assert not is_noise("note: scheduler.params.warmup_num_steps 12 -> 1\n")
    assert not is_noise("[rank 0] step 10: eval loss 6.2017, perplexity 493.60\n")


@pytest.mark.parametrize("verbose", [False, True])
def test_sink_in_a_pipe_shows_the_log_every_lines_and_keeps_everything_in_the_log(verbose):
    out, err, log = io.StringIO(), io.StringIO(), io.StringIO()
    sink = RunSink(log=log, verbose=verbose, live=False, out=out, err=err)
    for stream, line, _ in REAL_LINES[:7]:
        sink(stream, line)
    for step in range(1, 13):
        sink("stdout", _record(step, log=step in (1, 4, 8, 12)))
    for stream, line, _ in REAL_LINES[7:]:
        sink(stream, line)
    sink.close()
    shown = out.getvalue() + err.getvalue()
    assert "\r" not in shown
    assert re.findall(r"\] (\d+)/12 loss", out.getvalue()) == ["1", "4", "8", "12"]
    assert "[rank 0] [#...................] 1/12 loss 5.9900 21.2k tok/s lr 2.50e-04 00:00<00:01\n" in out.getvalue()
    for stream, line, show in REAL_LINES:
        assert (line in (out if stream == "stdout" else err).getvalue()) is (show or verbose), line
        assert line in log.getvalue()
    assert len(re.findall(r"/12 loss", log.getvalue())) == 12  # every step in the log, as a line
    assert "DSTK_PROGRESS" not in shown + log.getvalue()


def _screen_segments(text: str) -> list[str]:
    """What each carriage return or newline leaves to draw: the pieces a terminal puts on one row."""
    return [piece for piece in re.split(r"[\r\n]", text)]


@pytest.mark.parametrize("columns", [24, 40, 60, 80, 200])
def test_sink_on_a_terminal_redraws_one_line_that_fits_and_ends_with_a_newline(columns):
    out, err = io.StringIO(), io.StringIO()
    sink = RunSink(log=None, verbose=False, live=True, out=out, err=err, columns=lambda: columns)
    for step in range(1, 7):
        sink("stdout", _record(step, log=step == 1))
        if step == 3:
            sink("stdout", "[rank 0] step 3: eval loss 6.2017, perplexity 493.60\n")
            sink("stdout", REAL_LINES[2][1])  # hidden: no redraw for it
    for step in range(7, 13):
        sink("stdout", _record(step, log=False))
    sink("stdout", REAL_LINES[11][1])  # the summary
    sink.close()
    text = out.getvalue()
    drawn = [piece for piece in _screen_segments(text) if "/12 loss" in piece or not piece.strip()]
    assert len(drawn) >= 12 and all(len(piece) <= columns - 1 for piece in drawn), drawn
    # rows: ...the eval line (above the line being drawn) | the progress line's redraws, ended by one
    # newline at the last step | the summary | nothing after it
    assert text.count("\n") == 3
    with_eval, redraws, summary, rest = text.split("\n")
    assert with_eval.endswith("[rank 0] step 3: eval loss 6.2017, perplexity 493.60") and "3/12" in redraws
    final_row = redraws.split("\r")[-1].rstrip()
    assert final_row.startswith("[" if columns >= 80 else "12/12") and "12/12 loss 5.8800" in final_row
    assert summary + "\n" == REAL_LINES[11][1] and rest == ""
    assert text.count("\r") >= 12  # redrawn at every step
    assert "Attempting to get" not in text


def test_progress_line_gives_up_parts_in_order_and_never_exceeds_the_width():
    kwargs = dict(step=150, num_steps=1000, loss=2.345678, tokens_per_second=1.5e6, lr=3e-4, elapsed_seconds=3725)
    full = format_progress(**kwargs)
    assert full == "[###.................] 150/1000 loss 2.3457 1.5M tok/s lr 3.00e-04 1:02:05<5:51:48"
    seen = []
    for columns in range(1, 120):
        line = format_progress(**kwargs, max_columns=columns)
        assert len(line) <= columns
        seen.append(line)
    assert format_progress(**kwargs, max_columns=len(full)) == full
    assert any(s.startswith("[#.........] 150/1000") for s in seen) and "150/1000 loss 2.3457 ETA 5:51:48" in seen
    assert "150/1000 loss 2.3457" in seen  # narrower than the last form: it is cut


def test_eta_counts_the_steps_of_this_process_after_a_resume():
    assert eta_seconds(step=60, num_steps=100, start_step=50, elapsed_seconds=10) == pytest.approx(40)
    assert eta_seconds(step=60, num_steps=100, start_step=0, elapsed_seconds=10) == pytest.approx(10 / 60 * 40)
    assert eta_seconds(step=50, num_steps=100, start_step=50, elapsed_seconds=0) == 0.0


def test_a_record_round_trips_and_anything_else_is_not_one():
    rec = parse_record(progress_record(step=3, num_steps=9, loss=1.5, tokens_per_second=10.0, lr=1e-3,
                                       elapsed_seconds=2.0, start_step=1, log=False))
    assert rec == {"step": 3, "num_steps": 9, "loss": 1.5, "tokens_per_second": 10.0, "lr": 1e-3,
                   "elapsed_seconds": 2.0, "start_step": 1, "log": False}
    assert parse_record("DSTK_PROGRESS {not json") is None and parse_record("DSTK_PROGRESS {}") is None
    assert parse_record("step 3: eval loss 1.0") is None


def test_show_tail_names_the_log_and_prints_its_last_lines(tmp_path):
    log = tmp_path / "launch.log"
    log.write_text("".join(f"line {i}\n" for i in range(50)))
    err = io.StringIO()
    show_tail(log, num_lines=5, err=err)
    assert err.getvalue() == (f"dstk: the last 5 lines of {log} (the whole launch is there):\n"
                              + "".join(f"  | line {i}\n" for i in range(45, 50)))


# --- real runs: 2 CPU ranks on the deepspeed runner -------------------------------------------------------


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _finetune_args(out: Path, *extra: str) -> list[str]:
    data = ROOT / "templates" / "corpus" / "harbour-notes.txt"
    return [sys.executable, "-m", "dstk.cli", "finetune", "--model", "tiny-llama", "--data", str(data), "--gpus", "2",
            "--zero", "2", "--output", str(out), "--steps", "12", "--log-every", "4", *extra]


def _run_in_pty(argv: list[str], *, columns: int, timeout: float = 600) -> tuple[int, str]:
    """Run ``argv`` with stdout and stderr on a pseudo-terminal ``columns`` wide; (exit code, all it wrote)."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen(argv, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=_env(), cwd=ROOT,
                            start_new_session=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer has closed the pty
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        else:
            os.killpg(proc.pid, signal.SIGKILL)  # the runner and the ranks too
    finally:
        os.close(master)
    return proc.wait(timeout=30), b"".join(chunks).decode("utf-8", errors="replace")


@pytest.mark.distributed
def test_on_a_terminal_one_line_is_redrawn_in_place_and_the_logs_stay_in_the_file(tmp_path):
    columns = 60
    rc, text = _run_in_pty(_finetune_args(tmp_path / "out"), columns=columns)
    assert rc == 0, text[-4000:]
    # the pty turns "\n" into "\r\n"; every drawing of the progress line fits in columns - 1 (never wraps)
    rows = re.split(r"\r\n|\r|\n", text)
    progress = [r for r in rows if re.search(r"\d+/12 loss", r)]
    assert max(len(r) for r in progress) <= columns - 1, max(progress, key=len)
    assert [re.search(r"(\d+)/12 loss", r).group(1) for r in progress] == [str(i) for i in range(1, 13)]
    assert all("tok/s" in r and "lr " in r and "<" in r for r in progress)  # loss, tokens/s, lr, ETA at 60
    assert "[rank 0]" not in "".join(progress)
    # the final line ends with a newline and the summary comes after it
    last = text.index("12/12 loss")
    assert text.index("\r\n", last) < text.index("[rank 0] trained 12 steps")
    assert "exported HF model" in text and "logs: " in text
    for noise in ("[INFO]", "[WARNING]", "FutureWarning", "built successfully", "DSTK_PROGRESS"):
        assert noise not in text, noise
    log = (tmp_path / "out" / "logs" / "launch.log").read_text()
    assert "[INFO] [launch.py" in log and "[rank 0] [" in log and "[WARNING] [real_accelerator.py" in log
    assert len(re.findall(r"\[rank 0\] \[[#.]+\] \d+/12 loss", log)) == 12


@pytest.mark.distributed
def test_in_a_pipe_a_line_every_log_every_steps_and_verbose_shows_deepspeeds_lines(tmp_path):
    proc = run_group(_finetune_args(tmp_path / "out", "--verbose"), env=_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "\r" not in proc.stdout
    steps = re.findall(r"^\[rank 0\] \[[#.]{20}\] (\d+)/12 loss [\d.]+ [\d.]+k? tok/s lr \S+ \d\d:\d\d<\d\d:\d\d$",
                       proc.stdout, flags=re.M)
    assert steps == ["1", "4", "8", "12"], proc.stdout
    assert "[INFO] [launch.py" in proc.stdout and "[WARNING] [real_accelerator.py" in proc.stdout  # --verbose
    assert "DSTK_PROGRESS" not in proc.stdout + proc.stderr


@pytest.mark.distributed
def test_a_failed_run_shows_the_tail_of_its_log_and_where_it_is(tmp_path, capfd):
    from dstk.cli import main as dstk
    from dstk.train.logs import launch_logged

    out = tmp_path / "out"
    assert dstk(_finetune_args(out, "--prepare-only")[3:]) == 0
    spec = out / "finetune.json"
    (out / "prepared" / "train.pt").write_bytes(b"not a torch file")  # every rank fails loading it
    capfd.readouterr()
    rc = launch_logged(spec, output_dir=out, verbose=False)
    shown = capfd.readouterr()
    assert rc != 0
    log = out / "logs" / "launch.log"
    assert f"lines of {log} (the whole launch is there):" in shown.err
    tail = shown.err.split("(the whole launch is there):", 1)[1]
    assert "  | " in tail and ("UnpicklingError" in shown.err or "pickle" in shown.err.lower()), shown.err[-3000:]
