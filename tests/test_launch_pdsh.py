"""`dstk launch --launcher pdsh` run for real: pdsh over ssh to this machine (tests/services.py).

The deepspeed runner's multi-node path with a hostfile of ``localhost`` and ``127.0.0.1`` as two
"nodes" (1 slot each), ``--master-addr 127.0.0.1``, an sshd on a loopback port with a key made for the
test, and ``--env`` carried to every node in ``.deepspeed_env`` (ssh starts each node's command with a
fresh environment, so a value that arrives came through that file): the tiny example trains on the
2 ranks, and a SIGKILLed rank is named. Skipped, with the reason, where sshd cannot start.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dstk.launch.run import RankExit, parse_report
from tests.services import generate_two_node_run, ssh_with_env, sshd_fixture

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_SECONDS = 420  # a fresh machine builds DeepSpeed's ops on the first start (about 2 minutes)

KILLED_RANK = """\
import os, signal, sys, time
print(f"env={os.environ.get('DSTK_TEST_VALUE')!r} inherited={os.environ.get('DSTK_NOT_EXPORTED')!r}", flush=True)
time.sleep(0.5)
if os.environ["RANK"] == "1":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(1)
"""


sshd = sshd_fixture()


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny example generated for 2 nodes x 1 rank, and a hostfile naming this machine twice."""
    return generate_two_node_run(tmp_path_factory.mktemp("pdsh"), repo=REPO)


def launch(sshd, run: Path, hostfile: Path, *script: str, port: int) -> tuple[int, str]:
    env = {**os.environ, **sshd.env, "DSTK_NOT_EXPORTED": "leak"}
    argv = [sys.executable, "-m", "dstk", "launch", str(run), "--hostfile", str(hostfile), "--launcher", "pdsh",
            "--master-addr", "127.0.0.1", "--master-port", str(port), "--env", "DSTK_TEST_VALUE=over ssh", "--", *script]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"timed out:\n{exc.stdout}\n{exc.stderr}") from None
    return done.returncode, done.stdout + done.stderr


@pytest.mark.distributed
def test_two_ssh_nodes_train(sshd, two_node_run, free_port):
    run, hostfile = two_node_run
    rc, out = launch(sshd, run, hostfile, "examples/train.py", "--steps", "3", port=free_port)
    assert rc == 0, out[-4000:]
    # pdsh prefixes every line with its host; rank 0 is on the first host of the hostfile
    losses = re.findall(r"^localhost: \[rank 0\] step (\d) loss \d+\.\d+$", out, re.M)
    assert losses == ["1", "2", "3"], out[-4000:]
    assert re.search(r"^127\.0\.0\.1: \[rank 1\] ", out, re.M), out[-4000:]
    assert "did not report" not in out and "dstk: rank" not in out, out[-4000:]
    assert (run / ".deepspeed_env").read_text().splitlines()[-1] == "DSTK_TEST_VALUE=over ssh"


@pytest.mark.distributed
def test_killed_rank_on_an_ssh_node_is_named(sshd, two_node_run, tmp_path, free_port):
    run, hostfile = two_node_run
    script = tmp_path / "killed_rank.py"
    script.write_text(KILLED_RANK)
    rc, out = launch(sshd, run, hostfile, str(script), port=free_port)
    assert rc == 128 + 9, out[-4000:]
    assert f"dstk: rank 1 on {socket.gethostname()} was killed by SIGKILL (signal 9)\n" in out, out[-4000:]
    # .deepspeed_env reached both nodes; the launching shell's own environment did not
    for host, rank in (("localhost", 0), ("127.0.0.1", 1)):
        assert f"{host}: [rank {rank}] env='over ssh' inherited=None\n" in out, out[-4000:]
    assert "did not report" not in out, out[-4000:]


@pytest.mark.parametrize("prefix", ["", "localhost: ", "127.0.0.1: ", "node-7.cluster: "])
def test_rank_reports_are_read_behind_pdsh_host_prefixes(prefix):
    line = prefix + 'DSTK_RANK_EXIT {"rank": 1, "returncode": -9, "host": "n"}\n'
    assert parse_report(line) == RankExit(rank=1, returncode=-9, host="n")


@pytest.mark.parametrize("line", ['[rank 0] DSTK_RANK_EXIT {"rank": 1, "returncode": 3}',
                                  'a b: DSTK_RANK_EXIT {"rank": 1, "returncode": 3}',
                                  'localhost:DSTK_RANK_EXIT {"rank": 1, "returncode": 3}'])
def test_other_lines_are_not_reports(line):
    # a script that prints the tag itself appears behind its "[rank R] " prefix: not a report
    assert parse_report(line) is None


@pytest.mark.distributed
def test_a_stale_lock_on_a_node_stops_the_launch_before_any_rank_starts(sshd, two_node_run, tmp_path, free_port):
    """Each node's torch extensions cache can be its own (a container's, a node-local /tmp), and this machine
    cannot see it: a build killed there left its lock, and the node's ranks (and with them the whole launch)
    would wait for it forever. ``dstk launch`` asks every node over ssh before it starts any, names each
    node's stale locks with the ssh rm that clears them, and exits 1; with ``--env TORCH_EXTENSIONS_DIR`` it
    asks about that cache, the one the ranks would use."""
    run, hostfile = two_node_run
    node_cache = tmp_path / "node_ext"
    lock = node_cache / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    bin_dir = ssh_with_env(sshd, tmp_path, TORCH_EXTENSIONS_DIR=str(node_cache))
    env = {**os.environ, **sshd.env, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "TORCH_EXTENSIONS_DIR": str(tmp_path / "this_machine_ext")}  # this machine's own cache: clean

    def launch_here(*extra: str) -> tuple[int, str]:
        argv = [sys.executable, "-m", "dstk", "launch", str(run), "--hostfile", str(hostfile), "--launcher", "pdsh",
                "--master-addr", "127.0.0.1", "--master-port", str(free_port), *extra, "--", "examples/train.py",
                "--steps", "1"]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=TIMEOUT_SECONDS)
        return done.returncode, done.stdout + done.stderr

    rc, out = launch_here()
    assert rc == 1, out[-4000:]
    assert f"on localhost: {lock}; on 127.0.0.1: {lock}" in out, out[-4000:]
    assert f"ssh localhost 'rm {lock}'; ssh 127.0.0.1 'rm {lock}'" in out, out[-4000:]
    assert "[rank " not in out and "Traceback" not in out, out[-4000:]
    lock.unlink()
    ranks_cache = tmp_path / "ranks_ext"  # what --env gives the ranks: carried in .deepspeed_env
    other = ranks_cache / "cpu_adam" / "lock"
    other.parent.mkdir(parents=True)
    other.touch()
    rc, out = launch_here("--env", f"TORCH_EXTENSIONS_DIR={ranks_cache}")
    assert rc == 1 and f"on localhost: {other}; on 127.0.0.1: {other}" in out, out[-4000:]
    assert str(lock) not in out and "[rank " not in out, out[-4000:]
