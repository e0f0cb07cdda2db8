"""`dstk generate` writes its run directory complete or not at all, even when SIGKILLed at any
moment (also through a later --force), with modes that follow the umask, and refuses an --output
where no directory can be made with exit 1, the path and a fix (issue 15, part 3)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dstk.cli import main
from tests.procs import until_paused

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml")
FILES = {"README.md", "accelerate_config.yaml", "ds_config.hf.json", "ds_config.json", "megatron.args", "plan.json",
         "training_args.json"}

# The child runs the real CLI in its own interpreter; the writer's steps are wrapped so that the
# PAUSE_AT-th step prints where it is and sleeps until the parent SIGKILLs it (0: never pause;
# SLOW: sleep that long before each step instead, for kills at random moments).
CHILD = r"""
import os, sys, time
import dstk.render as r
pause_at = int(os.environ.get("PAUSE_AT", "0"))
slow = float(os.environ.get("SLOW", "0"))
count = [0]
def step(label):
    count[0] += 1
    if slow:
        time.sleep(slow)
    if count[0] == pause_at:
        print("PAUSED", label, flush=True)
        time.sleep(120)
def before(name):
    real = getattr(r, name)
    def wrapped(*a, **k):
        step(f"before {name}{a[1:2]}")
        return real(*a, **k)
    setattr(r, name, wrapped)
def after(name):
    real = getattr(r, name)
    def wrapped(*a, **k):
        out = real(*a, **k)
        step(f"after {name}")
        return out
    setattr(r, name, wrapped)
for name in ("_remove_stale", "_write_file", "_link_tree", "_fsync_dir"):
    before(name)
after("_exchange")
import shutil
real_rmtree = shutil.rmtree
def rmtree(path, *a, **k):
    step("before rmtree")
    return real_rmtree(path, *a, **k)
shutil.rmtree = rmtree
from dstk.cli import main
code = main(sys.argv[1:])
print("DONE", code, flush=True)
sys.exit(code)
"""


def _child(args: list[str], **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **env})


def _snapshot(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): p.read_text() for p in sorted(directory.rglob("*")) if p.is_file()}


def _temps(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".dstk-tmp-" in p.name)


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def _reference(tmp_path: Path, name: str, *flags: str) -> dict[str, str]:
    ref = tmp_path / name
    assert main(["generate", TINY, "-o", str(ref), *flags]) == 0
    return _snapshot(ref)


@pytest.mark.parametrize("force", [False, True], ids=["new", "force"])
def test_sigkill_at_every_step_leaves_old_or_new_never_a_mix(tmp_path, force):
    """Kill the writer at each of its steps in turn: the directory is the old one or the complete new
    one, with no temp files in it; a later `generate --force` leaves no temporary sibling, keeps the
    user's own files and removes the `.plan.json.*` an older writer left behind."""
    new = _reference(tmp_path, "ref-new", "--global-batch", "16")
    old = _reference(tmp_path, "ref-old")
    assert new != old
    parent = tmp_path / "runs"
    parent.mkdir()
    out = parent / "run"
    user_files = {"notes.txt": "mine\n", "ckpt/step1.bin": "weights\n", ".plan.json.Xq9aRt": "{\"half"}
    steps_seen = []
    for pause_at in range(1, 40):
        if out.exists():
            shutil.rmtree(out)
        for leftover in _temps(parent):
            shutil.rmtree(parent / leftover)
        if force:
            assert main(["generate", TINY, "-o", str(out)]) == 0
            for name, text in user_files.items():
                (out / name).parent.mkdir(exist_ok=True)
                (out / name).write_text(text)
            before = _snapshot(out)
        args = ["generate", TINY, "-o", str(out), "--global-batch", "16"] + (["--force"] if force else [])
        proc = _child(args, PAUSE_AT=str(pause_at))
        step = until_paused(proc)
        if step is None:
            proc.wait(timeout=60)
            break
        steps_seen.append(step)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        if not out.exists():
            assert not force, f"the old directory vanished (killed {steps_seen[-1]})"
        else:
            got = _snapshot(out)
            expected_new = {**new, **({k: v for k, v in user_files.items() if not k.startswith(".")} if force else {})}
            assert got in ((before,) if force else ()) + (expected_new,), f"a mix after a kill {steps_seen[-1]}"
            if got == expected_new:
                assert not _leftovers(out), steps_seen[-1]
        # a later --force tidies everything up
        assert main(["generate", TINY, "-o", str(out), "--global-batch", "16", "--force"]) == 0
        assert _temps(parent) == [], f"a temporary sibling survived the next --force (killed {steps_seen[-1]})"
        assert not _leftovers(out), steps_seen[-1]
        assert {k: v for k, v in _snapshot(out).items() if "/" not in k and k in FILES} == new
        if force:
            assert (out / "notes.txt").read_text() == "mine\n"
            assert (out / "ckpt" / "step1.bin").read_text() == "weights\n"
    else:
        pytest.fail("the writer never finished")
    # every step of the writer was a kill point
    assert sum(s.startswith("before _write_file") for s in steps_seen) == len(FILES)
    assert any(s.startswith("before _fsync_dir") for s in steps_seen)
    if force:
        assert "after _exchange" in steps_seen and "before rmtree" in steps_seen
        assert any(s.startswith("before _link_tree") for s in steps_seen)


def test_sigkill_at_random_moments_then_force(tmp_path):
    """SIGKILL at random moments of a slowed-down `--force` over an existing run: never a mix, and the
    next --force leaves no trace."""
    new = _reference(tmp_path, "ref-new", "--global-batch", "16")
    out = tmp_path / "run"
    assert main(["generate", TINY, "-o", str(out)]) == 0
    args = ["generate", TINY, "-o", str(out), "--global-batch", "16", "--force"]
    started = time.monotonic()
    assert _child(args, SLOW="0.1").wait(timeout=120) == 0
    whole_seconds = time.monotonic() - started  # start-up, planning, then ~15 writer steps of 0.1 s
    assert main(["generate", TINY, "-o", str(out), "--force"]) == 0
    rng = random.Random(15)
    kills = 0
    for _ in range(6):
        before = _snapshot(out)
        proc = _child(args, SLOW="0.1")
        time.sleep(rng.uniform(0.3, 1.0) * whole_seconds)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        kills += proc.returncode == -signal.SIGKILL
        assert _snapshot(out) in (before, new)
        assert not _leftovers(out)
        # half of the time, write the old plan back so the next kill replaces something
        if rng.random() < 0.5:
            assert main(["generate", TINY, "-o", str(out), "--force"]) == 0
    assert kills >= 3
    assert main(["generate", TINY, "-o", str(out), "--global-batch", "16", "--force"]) == 0
    assert _snapshot(out) == new and _temps(tmp_path) == [] and not _leftovers(out)


@pytest.mark.parametrize("umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750),
                                                         (0o077, 0o600, 0o700)])
def test_generated_files_follow_the_umask(tmp_path, umask, file_mode, dir_mode):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "dstk.cli", "generate", TINY, "-o", str(out)],
                          capture_output=True, text=True, preexec_fn=lambda: os.umask(umask), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {name: file_mode for name in FILES}
    assert out.stat().st_mode & 0o777 == dir_mode
    # --force keeps the directory's own mode and writes new files by the umask
    out.chmod(0o711)
    proc = subprocess.run([sys.executable, "-m", "dstk.cli", "generate", TINY, "-o", str(out), "--force"],
                          capture_output=True, text=True, preexec_fn=lambda: os.umask(umask), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_mode & 0o777 == 0o711
    assert {p.stat().st_mode & 0o777 for p in out.iterdir()} == {file_mode}


def _run_cli(args: list[str], *, cwd: Path, user: int | None = None) -> subprocess.CompletedProcess:
    as_user = [] if user is None else ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"]
    return subprocess.run([*as_user, sys.executable, "-m", "dstk.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


COMMANDS = {
    "generate": ["generate", TINY],
    "demo": ["demo"],
    "finetune": ["finetune", "--model", "tiny-llama", "--data", "corpus.txt"],
    "export": ["export", "ckpt"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("case", ["below-a-file", "dangling-link", "below-a-dangling-link", "is-a-file"])
def test_bad_output_paths_are_clear_errors(tmp_path, command, case):
    (tmp_path / "afile").write_text("x\n")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    output = {"below-a-file": "afile/run", "dangling-link": "dangling", "below-a-dangling-link": "dangling/run",
              "is-a-file": "afile"}[case]
    proc = _run_cli([*COMMANDS[command], "--output", output], cwd=tmp_path)
    if command in ("demo", "finetune", "export") and proc.returncode == 1 and "dstk[train]" in proc.stderr:
        pytest.skip("the training stack is not installed")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert f"--output {output}" in proc.stderr and "fix:" in proc.stderr
    assert {"below-a-file": "afile is a file", "dangling-link": "does not exist",
            "below-a-dangling-link": "does not exist", "is-a-file": "not a directory"}[case] in proc.stderr
    assert not (tmp_path / "nowhere").exists() and (tmp_path / "afile").read_text() == "x\n"


def test_unwritable_directory_is_a_clear_error():
    """As another user when the suite runs as root (root writes anywhere), in a directory it cannot write."""
    base = Path(tempfile.mkdtemp(prefix="dstk-ro-"))
    try:
        base.chmod(0o755)
        ro = base / "ro"
        ro.mkdir(mode=0o555)
        ro.chmod(0o555)
        user = 65534 if os.geteuid() == 0 else None
        if user is not None and shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv (util-linux) to drop to another user")
        cases = [["generate", TINY, "-o", "ro/run"], ["generate", TINY, "-o", "ro/deep/er/run"]]
        cases += [[*COMMANDS[c], "--output", "ro/run"] for c in ("demo", "finetune", "export")]
        for args in cases:
            proc = _run_cli(args, cwd=base, user=user)
            if proc.returncode == 1 and "dstk[train]" in proc.stderr:
                continue  # the training stack is not installed: demo/finetune/export stop before
            assert proc.returncode == 1, proc.stderr
            assert "ro is not writable" in proc.stderr and "fix:" in proc.stderr, proc.stderr
            assert "Traceback" not in proc.stderr
        assert list(ro.iterdir()) == [] and sorted(p.name for p in base.iterdir()) == ["ro"]
    finally:
        (base / "ro").chmod(0o755)
        shutil.rmtree(base)


def test_generate_format_json_names_the_written_files(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["generate", TINY, "-o", str(out), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["files"]) == FILES and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_output_dot_is_written_in_place(tmp_path, monkeypatch):
    """`-o .` is the directory the shell is in: it is not swapped (the shell would be left in a
    deleted directory); each file is replaced whole, modes by the umask, the user's files kept."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    inode = here.stat().st_ino
    assert main(["generate", TINY, "-o", "."]) == 0
    (here / "notes.txt").write_text("mine\n")
    assert main(["generate", TINY, "-o", ".", "--global-batch", "16", "--force"]) == 0
    assert os.stat(".").st_ino == inode and here.stat().st_ino == inode
    assert json.loads((here / "ds_config.json").read_text())["train_batch_size"] == 16
    assert {p.name for p in here.iterdir()} == FILES | {"notes.txt"}
    assert _temps(tmp_path) == []


def test_force_without_rename_exchange_falls_back_to_two_renames(tmp_path, monkeypatch, capsys):
    """Where neither renameat2(RENAME_EXCHANGE) nor renamex_np exists (or the filesystem refuses it),
    --force still replaces the directory, keeps the user's files and leaves no temporary sibling."""
    import dstk.render

    out = tmp_path / "run"
    assert main(["generate", TINY, "-o", str(out)]) == 0
    (out / "notes.txt").write_text("mine\n")
    monkeypatch.setattr(dstk.render, "_exchange", lambda a, b: False)
    assert main(["generate", TINY, "-o", str(out), "--global-batch", "16", "--force"]) == 0
    assert json.loads((out / "ds_config.json").read_text())["train_batch_size"] == 16
    assert (out / "notes.txt").read_text() == "mine\n" and _temps(tmp_path) == []


def test_write_atomic_follows_the_umask_too(tmp_path):
    """The single-file writer that finetune, launch and checkpoints use (mkstemp alone gives 0600)."""
    from dstk.launch.run import write_atomic

    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "summary.json", "{}\n")
    finally:
        os.umask(old)
    assert (tmp_path / "summary.json").stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
