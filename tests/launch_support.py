"""Helpers shared by the tests that start a real ``dstk launch`` next to a decoy and stop it with a signal
(tests/test_launch_interrupt.py, tests/test_launch_signals.py): the decoy (another run's launch.py with one
sleeping rank), the processes' command lines, a launch's output read in a thread, and the cleanup that
every such test ends with (``stop_all``)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

TIMEOUT_SECONDS = 420  # a fresh machine builds DeepSpeed's ops on the first start (about 2 minutes)

SLEEPER = """\
import os, time
print(f"ready {os.environ.get('RANK', '?')}", flush=True)
time.sleep(600)
"""

RANK_IDENTITY = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR",
                 "GROUP_RANK", "ROLE_RANK", "PYTHON_DSTK_RUN_TAG")


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what an in-process DeepSpeed test may have left behind."""
    return {**{k: v for k, v in os.environ.items() if k not in RANK_IDENTITY}, **extra}


REPO = Path(__file__).resolve().parent.parent


def save_tiny_hf_model(root: Path) -> Path:
    """A tiny Llama saved with save_pretrained under ``root/model``, with a tokenizer of its own trained on the
    shipped corpus: what a user's ``--model HF_DIR`` is. Returns that directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from dstk.train.tokenizer import train_tokenizer

    corpus = REPO / "templates" / "corpus" / "harbour-notes.txt"
    tok = train_tokenizer(corpus.read_text().splitlines(), vocab_size=512, output_dir=root / "tok")
    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    LlamaForCausalLM(cfg).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    return root / "model"


def run_env() -> dict[str, str]:
    """The environment of a ``python -m dstk.cli`` run a test starts: this one without a terminal size (the
    progress line then logs as in a pipe), with the checkout first on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture(scope="module")
def python(tmp_path_factory) -> str:
    """This venv under a path of the test's own: ``ROOT/bin/python`` next to a copy of its pyvenv.cfg, with
    its lib/ linked. The runner's pkill pattern holds the interpreter's path, so whatever a broken stop
    kills stays within this test (other launches on this machine use the venv's own path)."""
    venv = Path(sys.prefix)
    if not (venv / "pyvenv.cfg").is_file():
        pytest.skip("not running in a venv: the test needs an interpreter path of its own")
    root = tmp_path_factory.mktemp("venv")
    (root / "bin").mkdir()
    (root / "pyvenv.cfg").write_text((venv / "pyvenv.cfg").read_text())
    (root / "lib").symlink_to(venv / "lib")
    (root / "bin" / "python").symlink_to(Path(sys.executable).resolve())
    python = str(root / "bin" / "python")
    done = subprocess.run([python, "-c", "import sys, deepspeed, dstk; print(sys.executable)"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.splitlines()[-1:] == [python], done.stdout + done.stderr
    return python


def cmdlines() -> dict[int, str]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                text = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (entry / "stat").read_text().rsplit(") ", 1)[-1][:1]
            except OSError:
                continue
            if text and state not in ("Z", "X"):
                out[int(entry.name)] = text
    return out


class Output:
    """A process's merged output, read in a thread."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc) -> None:
        for line in proc.stdout:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, predicate, *, what: str, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while not predicate(self.text()):
            assert proc.poll() is None, f"{what}: it exited {proc.returncode}\n{self.text()[-4000:]}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}\n{self.text()[-4000:]}"
            time.sleep(0.2)

    def join(self) -> None:
        self._thread.join(timeout=10)


def start_decoy(tmp_path: Path, port: int, *, python: str) -> subprocess.Popen:
    """Another run's launch.py (same interpreter, one rank that sleeps), started the way pdsh starts one on a
    node: ``PYTHON -u -m deepspeed.launcher.launch --world_info=... SCRIPT`` -- what the runner's pkill matches."""
    script = tmp_path / "decoy_rank.py"
    script.write_text(SLEEPER)
    world = base64.urlsafe_b64encode(json.dumps({"localhost": [0]}).encode()).decode()
    argv = [python, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world}", "--node_rank=0",
            "--master_addr=127.0.0.1", f"--master_port={port}", str(script)]
    return subprocess.Popen(argv, env=clean_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def stop_group(proc: subprocess.Popen | None) -> None:
    """SIGKILL to the process group of ``proc`` (started with ``start_new_session``) if it still runs."""
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def _kill_left(pattern: str) -> None:
    """SIGKILL to every process whose command line holds ``pattern`` (what outlived its group: reparented ranks)."""
    for pid, cmd in cmdlines().items():
        if pattern in cmd:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def hangup_default() -> None:
    """``preexec_fn`` for a launch a test will signal: SIGHUP and SIGINT back to their default actions. A
    suite started under ``nohup`` passes SIGHUP ignored to every child, and one started as a background job
    of a shell without job control passes SIGINT ignored (Python then never raises KeyboardInterrupt);
    dstk rightly keeps a signal that was ignored when it started ignored (``dstk.launch.run``): the test is
    of dstk's handling, not of how the suite was started."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_all(*procs: subprocess.Popen | None, patterns: tuple[str, ...] = ()) -> None:
    """A test's cleanup, whatever it asserted: kill each started process's group (the launch first, then the
    decoy), then any process left whose command line holds one of ``patterns`` (the run's training script,
    the decoy's rank)."""
    for proc in procs:
        stop_group(proc)
    for pattern in patterns:
        _kill_left(pattern)
