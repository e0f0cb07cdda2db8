"""What a person sees while the ranks run, and where the rest goes.

The parent process (``dstk finetune``, ``dstk demo``) owns the terminal. Every line the deepspeed
runner and the ranks print reaches it through ``dstk.launch.run_launch``'s sink; ``RunSink``:

- writes every line to the run's log (``OUTPUT/logs/launch.log``);
- keeps DeepSpeed's and torch's INFO/WARNING chatter (``is_noise``) off the terminal unless ``verbose``;
- turns rank 0's progress records (``dstk.train.progress.progress_record``) into the progress
  line: on a terminal one line redrawn in place (carriage return, cut to the terminal's width),
  elsewhere a line every ``--log-every`` steps;
- passes everything else (dstk's own lines, errors, tracebacks) through.

It also holds the ``--report-to`` choices: which DeepSpeed monitor blocks they become
(``monitor_blocks``) and which package each one needs (``check_report_to``).
"""

from __future__ import annotations

import collections
import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Callable, TextIO

from dstk.train.progress import format_progress, parse_record

LOG_NAME = "launch.log"
"""The run's log file, in OUTPUT/logs/."""

_RANK_PREFIX = re.compile(r"(?:[A-Za-z0-9._-]+: )?\[rank [0-9?]+\] ")
"""``[rank R] `` of ``dstk.launch.rank``, behind pdsh's ``HOST: `` when there is one."""

_TORCH_RANK = re.compile(r"\[rank\d+\]: ")
"""``[rankN]: ``, which torch.distributed's elastic error handler puts before each line of a rank's traceback."""

SIGNAL_SAVED = re.compile(r"dstk: SIG[A-Z0-9]+ reached the ranks: saved the checkpoint of step \d+")
"""Rank 0's line once the ranks saved a checkpoint on a stop signal (``dstk.train.worker.stop_line``), behind the
rank wrapper's ``[rank 0]`` prefix (and pdsh's ``HOST:``): the run stopped as asked, no rank failed."""

_BLOCK_START = ("Traceback (most recent call last):", "Error in sys.excepthook:",
                "During handling of the above exception", "The above exception was the direct cause",
                "object address  :")
"""Lines that begin what CPython prints for an uncaught exception (``RunSink._traceback``)."""
_BLOCK_GOES_ON = _BLOCK_START + ("Original exception was:", "object ", "lost sys.stderr")
"""Unindented lines inside such a block; ``lost sys.stderr`` ends the object dump (and the block)."""

_PY_WARNING = re.compile(r".+:\d+: [A-Z]\w*Warning: ")
"""Python's ``warnings.showwarning``: ``FILE:LINE: CATEGORY: message``, its source line follows indented."""

_NOISE = re.compile("|".join([
    # DeepSpeed's logger, deepspeed/utils/logging.py line 39: "[%(asctime)s] [%(levelname)s] [file:line:func]"
    r"\[\d{4}-\d\d-\d\d [\d:,.]+\] \[(?:DEBUG|INFO|WARNING)\] ",
    _PY_WARNING.pattern,
    # c10's logging (torch.distributed, gloo): "[W1203 08:18:44.123456 file.cpp:514] ..." (I and W; E and F stay)
    r"\[?[IW]\d{4} \d\d:\d\d:\d\d[.\d]* ",
    # logging.basicConfig's format, used by torch.distributed.elastic: "WARNING:torch.distributed.run:..."
    r"(?:DEBUG|INFO|WARNING):[\w.]+:",
    # torch.utils.cpp_extension and DeepSpeed's op builder (first start builds, later ones load)
    r"Using \S+ as PyTorch extensions root", r"Emitting ninja build file ", r"Building extension module ",
    r"Allowing ninja to set a default number of workers", r"ninja: no work to do", r"Loading extension module ",
    r"Time to load \S+ op: ", r"DeepSpeed \S+ built successfully",
]))


def split_prefix(line: str) -> tuple[str, str]:
    """(``[rank R] `` prefix or "", the rest)."""
    match = _RANK_PREFIX.match(line)
    return (line[:match.end()], line[match.end():]) if match else ("", line)


def is_noise(line: str) -> bool:
    """True for DeepSpeed's and torch's INFO/WARNING lines (the launcher's, or a rank's behind its
    ``[rank R]`` prefix) and the op loader's; errors, tracebacks and dstk's own lines are not."""
    return _NOISE.match(split_prefix(line)[1]) is not None


def terminal_columns(stream: TextIO) -> int:
    """The width of the terminal ``stream`` writes to (``COLUMNS`` first, as ``shutil`` does)."""
    try:
        if "COLUMNS" not in os.environ:
            return os.get_terminal_size(stream.fileno()).columns or 80
    except (OSError, ValueError, AttributeError):
        pass
    return shutil.get_terminal_size().columns


class RunSink:
    """A ``run_launch`` sink (``sink(stream, line)``); call ``close()`` when the launch has ended.

    ``live``: draw the progress line in place on ``out`` (a terminal); otherwise print the records
    marked ``log`` as lines. The line is cut to ``columns() - 1`` characters (a line as wide as the
    terminal wraps on some terminals) and blanked with spaces, not escape codes, so it also works
    where ``TERM=dumb``. A line printed while the progress line is drawn goes above it."""

    __slots__ = ("log", "verbose", "live", "out", "err", "columns", "_drawn", "_record", "_warning", "_interrupted",
                 "_held", "stopped", "saved_on_signal")

    def __init__(self, *, log: TextIO | None, verbose: bool, live: bool, out: TextIO, err: TextIO,
                 columns: Callable[[], int] | None = None):
        self.log, self.verbose, self.live, self.out, self.err = log, verbose, live, out, err
        self.columns = columns or (lambda: terminal_columns(out))
        self._drawn = 0  # characters of the progress line now on the terminal
        self._record: dict | None = None
        self._warning: set[tuple[str, str]] = set()  # (stream, prefix) whose last line was a hidden warning
        self._interrupted = False
        self._held: dict[tuple[str, str], list[str]] = {}  # (stream, prefix) -> a traceback not yet ended
        self.stopped = False
        """dstk stopped the run on a signal it was sent (``dstk: stopped by SIGTERM: ...``): no rank failed."""
        self.saved_on_signal = False
        """The ranks saved a checkpoint on a stop signal and exited (``SIGNAL_SAVED``): no rank failed."""

    def __call__(self, stream: str, line: str) -> None:
        prefix, text = split_prefix(line)
        record = parse_record(text.rstrip("\n"))
        if record is not None:
            self._log(prefix + format_progress(**_figures(record)) + "\n")  # every step, as a line
            self._progress(prefix, record)
            return
        self._log(line)
        if not prefix and text.startswith("dstk: stopped by SIG"):
            self.stopped = True
        if prefix.endswith("[rank 0] ") and SIGNAL_SAVED.match(text):
            self.saved_on_signal = True
        key = (stream, prefix)
        if key in self._warning and text[:1] in (" ", "\t"):
            hidden = True  # the source line Python prints under a warning
            self._warning.discard(key)
        else:
            self._warning.discard(key)
            hidden = is_noise(line)
            if hidden and _PY_WARNING.match(text):
                self._warning.add(key)
        if hidden and not self.verbose:
            return
        if self._interrupted and not text.startswith("dstk: ") and not self.verbose:
            return
        if not self.verbose:
            lines = self._traceback(key, line, _TORCH_RANK.sub("", text, count=1))
            if lines is None:
                return
        else:
            lines = [line]
        self._clear()
        target = self.out if stream == "stdout" else self.err
        for one in lines:
            target.write(one if one.endswith("\n") else one + "\n")
        target.flush()
        self._draw()

    def _traceback(self, key: tuple[str, str], line: str, body: str) -> list[str] | None:
        """The lines to show now. A traceback (and what CPython prints around one: a chained exception's
        header, ``Error in sys.excepthook:``, the object dump of an exception it could not print) is held
        until its last line -- the first unindented line that is none of those -- and then shown whole, unless
        it is a ``KeyboardInterrupt``: a rank's answer to the terminal's Ctrl-C, which can reach the ranks
        (and a second time, through launch.py and the rank wrapper) before dstk's own handler runs. From then
        on the ranks' lines stay in the log (``interrupt``)."""
        held = self._held.get(key)
        if held is None and not body.startswith(_BLOCK_START):
            return [line]
        if held is None:
            held = self._held[key] = []
        held.append(line)
        if body[:1] in (" ", "\t") or not body.strip() or (
                body.startswith(_BLOCK_GOES_ON) and body.strip() != "lost sys.stderr"):
            return None
        del self._held[key]
        if any("KeyboardInterrupt" in one for one in held):
            self._interrupted = True
            self._held.clear()  # the other ranks' tracebacks now are the same Ctrl-C's
            return []
        return held

    def interrupt(self) -> None:
        """Ctrl-C reached the run (``dstk.launch.run`` calls this on KeyboardInterrupt): from now on only dstk's
        own lines reach the terminal. Every rank and the runner answer a terminal's SIGINT with a
        KeyboardInterrupt traceback (5 tracebacks, about 130 lines, for 2 CPU ranks) that says nothing the
        user does not know; they stay in the log (and show with ``verbose``)."""
        self._interrupted = True

    def close(self) -> None:
        """Show a traceback that never ended (the rank died while printing it); end a progress line left on
        the terminal with a newline."""
        for (stream, _prefix), lines in self._held.items():
            self._clear()
            target = self.out if stream == "stdout" else self.err
            target.write("".join(one if one.endswith("\n") else one + "\n" for one in lines))
            target.flush()
        self._held.clear()
        if self._drawn:
            self.out.write("\n")
            self.out.flush()
            self._drawn = 0
        self._record = None

    def _log(self, text: str) -> None:
        if self.log is not None:
            self.log.write(text)
            self.log.flush()

    def _progress(self, prefix: str, record: dict) -> None:
        if not self.live:
            if record["log"]:
                self.out.write(prefix + format_progress(**_figures(record)) + "\n")
                self.out.flush()
            return
        self._record = record
        self._draw()
        if record["step"] >= record["num_steps"]:
            self.close()  # the last step's line stays, and what follows (the summary) goes below it

    def _draw(self) -> None:
        if self._record is None:
            return
        text = format_progress(**_figures(self._record), max_columns=max(self.columns() - 1, 1))
        self.out.write("\r" + text + " " * max(self._drawn - len(text), 0))
        self.out.flush()
        self._drawn = len(text)

    def _clear(self) -> None:
        if self._drawn:
            self.out.write("\r" + " " * self._drawn + "\r")
            self.out.flush()
            self._drawn = 0


def _figures(record: dict) -> dict:
    return {k: record[k] for k in ("step", "num_steps", "loss", "tokens_per_second", "lr", "elapsed_seconds",
                                   "start_step")}


def open_log(output_dir: str | os.PathLike, *, append: bool) -> tuple[TextIO, Path]:
    """OUTPUT/logs/launch.log, new or (a resumed run) appended to."""
    path = Path(output_dir) / "logs" / LOG_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a" if append else "w", encoding="utf-8"), path


def show_tail(path: str | os.PathLike, *, num_lines: int = 20, err: TextIO | None = None) -> None:
    """After a failed run: the log's last lines and where the rest is (the cause may be in a
    line the terminal did not show), on ``err`` (default: ``sys.stderr`` now)."""
    err = err or sys.stderr
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            tail = collections.deque(f, maxlen=num_lines)
    except OSError:
        return
    err.write(f"dstk: the last {len(tail)} lines of {path} (the whole launch is there):\n")
    for line in tail:
        err.write("  | " + line.rstrip("\n") + "\n")
    err.flush()


def launch_logged(spec_path: str | os.PathLike, *, output_dir: str | os.PathLike, verbose: bool,
                  ranks_to_stderr: bool = False, master_port: int | None = None, append: bool = False) -> int:
    """``dstk.train.prepare.launch`` with a ``RunSink``: the progress line drawn in place when the
    ranks' stream (stdout, or stderr with ``ranks_to_stderr``) is a terminal, everything in
    OUTPUT/logs/launch.log, and after a failure the log's last lines (``show_tail``)."""
    import time

    from dstk.train.prepare import launch

    log, path = open_log(output_dir, append=append)
    if append:
        log.write(f"\n==== resumed {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    out = sys.stderr if ranks_to_stderr else sys.stdout
    sink = RunSink(log=log, verbose=verbose, live=out.isatty(), out=out, err=sys.stderr)
    try:
        rc = launch(spec_path, master_port=master_port, sink=sink)
    finally:
        sink.close()
        log.close()
    if rc != 0 and not (sink.stopped or sink.saved_on_signal):  # a failure's cause may be in a hidden line; a stop asked for has none
        show_tail(path)
    else:
        out.write(f"logs: {path.parent}{os.sep}  ({LOG_NAME}: the launch, DeepSpeed's and torch's own lines"
                  f"{'' if verbose else ', not shown here'})\n")
        out.flush()
    return rc


# --report-to

REPORTERS = ("csv", "tensorboard", "wandb")
_PACKAGE = {"tensorboard": "tensorboard", "wandb": "wandb"}
"""The package each backend imports: DeepSpeed's TensorBoardMonitor uses torch.utils.tensorboard,
which needs ``tensorboard`` (deepspeed/monitor/utils.py check_tb_availability); WandbMonitor needs
``wandb``. csv needs nothing (deepspeed/monitor/csv_monitor.py writes with the csv module)."""


def parse_report_to(text: str | None) -> tuple[str, ...]:
    """``--report-to csv,tensorboard`` -> ("csv", "tensorboard"); None -> ("csv",); "none" -> ()."""
    from dstk.errors import UsageError

    if text is None:
        return ("csv",)
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if names == ["none"]:
        return ()
    unknown = [n for n in names if n not in REPORTERS]
    if unknown or not names:
        raise UsageError(f"--report-to {text}: unknown {', '.join(unknown) or 'empty list'}",
                         hint=f"a comma list of {', '.join(REPORTERS)}, or none")
    return tuple(dict.fromkeys(names))


def check_report_to(names: tuple[str, ...], *, find=importlib.util.find_spec) -> None:
    """Refuse a backend whose package is not installed here, with the pip command (the ranks use
    this interpreter: DeepSpeed would otherwise fail on rank 0 after the model was built)."""
    from dstk.errors import DstkError

    missing = [n for n in names if n in _PACKAGE and find(_PACKAGE[n]) is None]
    if missing:
        packages = " ".join(_PACKAGE[n] for n in missing)
        raise DstkError(f"--report-to {','.join(missing)}: the package {packages} is not installed "
                        f"in {sys.prefix}", hint=f"{sys.executable} -m pip install {packages}  (or drop "
                                                 f"{','.join(missing)} from --report-to; csv needs nothing)")


def monitor_blocks(names: tuple[str, ...], *, logs_dir: str) -> dict:
    """DeepSpeed's monitor blocks (deepspeed/monitor/config.py) for ``names``, writing under
    ``logs_dir``: csv to ``logs_dir/csv/<event>.csv``, tensorboard to ``logs_dir/tensorboard``.
    wandb's block has no directory: ``wandb_env`` points it at ``logs_dir/wandb``."""
    blocks = {}
    if "csv" in names:
        blocks["csv_monitor"] = {"enabled": True, "output_path": logs_dir, "job_name": "csv"}
    if "tensorboard" in names:
        blocks["tensorboard"] = {"enabled": True, "output_path": logs_dir, "job_name": "tensorboard"}
    if "wandb" in names:
        blocks["wandb"] = {"enabled": True, "project": "dstk-finetune"}
    return blocks


def wandb_env(*, logs_dir: str, environ=os.environ) -> dict[str, str]:
    """wandb offline (there may be no network; ``wandb sync OUTPUT/logs/wandb/offline-run-*`` uploads
    later) unless the user set ``WANDB_MODE``; its files under ``logs_dir`` unless ``WANDB_DIR`` is set."""
    env = {}
    if "WANDB_MODE" not in environ:
        env["WANDB_MODE"] = "offline"
    if "WANDB_DIR" not in environ:
        env["WANDB_DIR"] = logs_dir
    return env


# --resume: the csv metrics go on from the checkpoint's step

def trim_csv_metrics(csv_dir: str | os.PathLike, *, last_step: int, last_samples: int) -> list[Path]:
    """Before a resumed run writes its first metric: cut every DeepSpeed csv monitor file in ``csv_dir``
    (``csv_monitor.py``: one ``<event>.csv`` per event, rows ``step,value`` under one ``step,<name>`` header) to
    its rows up to the checkpoint the run goes on from: ``last_step`` for dstk's events (``Train/loss``, ...),
    ``last_samples`` for DeepSpeed's own ``Train/Samples/*`` events, whose first column is the engine's
    ``global_samples`` (engine.py ``summary_events``, 0.19.8), not a step. The steps after the checkpoint
    (trained before the stop, lost with it) are trained again and written again, so a file holds each step
    once, in order. A
    header repeated inside a file (a resume by an older dstk: DeepSpeed writes the header again in every
    process) is dropped. Each file is replaced whole (``write_atomic``); returns the files that changed.

    DeepSpeed's monitor would write the header again in the resumed process: ``continue_csv_monitor``."""
    import csv
    import io

    from dstk.launch.run import write_atomic

    changed = []
    for path in sorted(Path(csv_dir).glob("*.csv")) if Path(csv_dir).is_dir() else []:
        last = last_samples if "_Samples_" in path.stem else last_step
        text = path.read_text(encoding="utf-8")
        rows = list(csv.reader(io.StringIO(text)))
        header = rows[0] if rows else None
        kept = [header] if header else []
        for row in rows[1:]:
            if row == header or not row:
                continue
            try:
                step = int(row[0])
            except ValueError:
                continue
            if step <= last:
                kept.append(row)
        if kept != rows:
            out = io.StringIO()
            csv.writer(out).writerows(kept)  # as DeepSpeed's monitor writes them
            write_atomic(path, out.getvalue())
            changed.append(path)
    return changed


def continue_csv_monitor(monitor, *, last_step: int, last_samples: int) -> list[Path]:
    """On a resume, rank 0, before the first step: ``trim_csv_metrics`` of DeepSpeed's csv monitor directory
    (``engine.monitor.csv_monitor.log_dir``), then tell the monitor those files have their header. It writes
    ``step,<name>`` on its first write of each event in a process (deepspeed/monitor/csv_monitor.py, 0.19.8:
    ``if filename not in self.filenames``), which after a resume would be a second header. Returns the files
    trimmed; nothing without a csv monitor."""
    csv_monitor = getattr(monitor, "csv_monitor", None)
    log_dir = getattr(csv_monitor, "log_dir", None)
    if csv_monitor is None or not getattr(csv_monitor, "enabled", False) or log_dir is None:
        return []
    changed = trim_csv_metrics(log_dir, last_step=last_step, last_samples=last_samples)
    for path in sorted(Path(log_dir).glob("*.csv")):
        if path.stat().st_size and path.stem not in csv_monitor.filenames:
            csv_monitor.filenames.append(path.stem)
    return changed
