"""DeepSpeed's CPU shm all-reduce leaks a 66 MiB /dev/shm buffer per rank per run (dstk.launch.shm).

- names are parsed as shm.cpp writes them; only the finished run's unused buffers are removed
  (another port's, a mapped one, and one held open but not yet mapped, as shm.cpp's ``shared_create``
  holds its new buffer while it writes it, stay);
- a real `dstk launch` on 2 CPU ranks: the ranks see their buffers while they run, and none is left
  after the launch, whether it succeeded or its ranks failed; other runs' buffers are untouched;
- `dstk doctor` reports leaked buffers with their size and the fix; `doctor --fix` removes them.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dstk.launch import shm
from tests.procs import run_group
from tests.test_launch import write_run_dir

SCRIPT = Path(__file__).parent / "data" / "shm" / "shm_rank.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
UID = os.getuid()


def test_parse_name_as_shm_cpp_writes_it():
    assert shm.parse_name("deepspeed_allreduce_buffer_0_127.0.0.1_32849_1") == (0, "127.0.0.1", 32849, 1)
    assert shm.parse_name("deepspeed_allreduce_buffer_1000_node-3.cluster_29500_15") == (1000, "node-3.cluster", 29500, 15)
    assert shm.parse_name("deepspeed_allreduce_buffer_7___0") == (7, "", None, 0)  # MASTER_ADDR/PORT unset
    assert shm.parse_name("deepspeed_allreduce_buffer_x") is None
    assert shm.BUFFER_BYTES == 69_206_024


def _fake(shm_dir: Path, *, port: int, rank: int, uid: int = UID, size: int = 4096) -> Path:
    path = shm_dir / f"{shm.PREFIX}_{uid}_127.0.0.1_{port}_{rank}"
    path.write_bytes(b"\0" * size)
    return path


def test_only_this_runs_unused_buffers_are_removed(tmp_path):
    mine = [_fake(tmp_path, port=31000, rank=r) for r in range(4)]
    other_port = _fake(tmp_path, port=31001, rank=0)
    other_user = _fake(tmp_path, port=31000, rank=0, uid=UID + 1)
    with open(mine[2], "r+b") as f:  # rank 2's: mapped by a live process (its descriptor closed)
        live = mmap.mmap(f.fileno(), 0)
    held = open(mine[3], "r+b")  # rank 3's: open, not yet mapped (shared_create writing it)
    try:
        assert {str(mine[2]), str(mine[3])} <= shm.in_use_paths()
        removed = shm.remove_run_buffers(master_port=31000, shm_dir=str(tmp_path))
        assert live[:1] == b"\0"
    finally:
        live.close()
        held.close()
    assert sorted(removed) == sorted(map(str, mine[:2]))
    assert [p.exists() for p in mine] == [False, False, True, True]
    assert other_port.exists() and other_user.exists()
    leaked = shm.leaked_buffers(shm_dir=str(tmp_path))  # nothing holds them now
    assert sorted(b.path for b in leaked) == sorted(map(str, (mine[2], mine[3], other_port, other_user)))
    assert sum(b.size_bytes for b in leaked) == 4 * 4096


PRIVATE = Path(__file__).parent / "data" / "shm" / "in_private_shm.py"


@pytest.mark.distributed
@pytest.mark.parametrize("code", [0, 3])
def test_launch_removes_its_own_buffers_and_only_those(tmp_path, free_port, code):
    """In a private /dev/shm (a mount namespace with its own tmpfs): on a shared machine other test
    sessions remove unused buffers at any moment, which would hide a launch that leaks."""
    run_dir = write_run_dir(tmp_path / "run", num_nodes=1, gpus_per_node=2)
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs -o size=1g dstk-test-shm /dev/shm && exec "$0" "$@"',
            sys.executable, str(PRIVATE), str(run_dir), str(free_port), str(code)]
    probe = subprocess.run(argv[:6] + ["mount -t tmpfs -o size=1m x /dev/shm"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no private /dev/shm (unshare --mount needs root): {probe.stderr.strip()}")
    out = run_group(argv, stderr=subprocess.STDOUT, env=ENV, timeout=300).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, out[-4000:]
    result = json.loads(line[len("RESULT "):])
    assert result["rc"] == code, result["out"][-4000:]
    seen = re.findall(r"\[rank (\d)\] sum=2 buffer=(\S+) exists=True", result["out"])
    assert sorted(r for r, _ in seen) == ["0", "1"], result["out"][-4000:]  # the ranks made their buffers
    assert result["left"] == [result["live"]], result  # theirs removed; the live run's kept


def test_doctor_reports_leaked_buffers_and_fix_removes_them(tmp_path, capsys, monkeypatch):
    from dstk.cli import main

    monkeypatch.setenv("DSTK_SHM_DIR", str(tmp_path))  # private: other sessions clean /dev/shm at any time
    port = 29500
    leaked = [shm.buffer_path(master_addr="127.0.0.1", master_port=port, rank=r) for r in range(2)]
    try:
        for path in leaked:
            with open(path, "wb") as f:
                f.truncate(shm.BUFFER_BYTES)  # sparse: a 66 MiB size without the memory
        rc = main(["doctor", "--num-ranks", "2", "--no-allreduce", "--format", "json"])
        checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
        leak = checks["shm leaks"]
        assert leak["status"] == "warn", leak
        assert set(map(str, leaked)) <= set(leak["data"]["paths"])
        assert leak["data"]["total_bytes"] >= 2 * shm.BUFFER_BYTES
        assert "dstk doctor --fix" in leak["hint"] and str(leaked[0]) in leak["hint"]
        assert rc in (0, 1)
        main(["doctor", "--num-ranks", "2", "--no-allreduce", "--fix", "--format", "json"])
        checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
        assert set(map(str, leaked)) <= set(checks["fixed shm"]["data"]["removed"])
        assert not any(p.exists() for p in leaked)
        assert not any(str(p) in json.dumps(checks["shm leaks"]) for p in leaked)
    finally:
        for path in leaked:
            path.unlink(missing_ok=True)
