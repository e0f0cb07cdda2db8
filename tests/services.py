"""Real services for the launch tests: a one-node Slurm cluster and an sshd for pdsh, on loopback.

Both run from a temporary directory that holds every file they use (configs, keys, state, logs,
pid files) and are stopped by ``stop()``; nothing under /etc or ~ is written. Every wait has a
timeout. What cannot be started (not root, no apt, a daemon that will not come up) raises
``Unavailable`` with the reason, which the fixtures turn into a skip.

    python tests/services.py install     # apt-get the Debian packages if missing (CI calls this)

Slurm (Debian's slurm-wlm 22.05): ``munged`` with a key made here and its own socket;
``slurmctld`` + ``slurmd`` with a generated ``slurm.conf`` that needs no cgroups
(``proctrack/linuxproc``; ``task/affinity`` by default, which pins each task to the CPUs Slurm gave it
with ``sched_setaffinity``, as clusters do, so a job that asks for too few CPUs shows it) and no accounting daemon (``accounting_storage/none``,
``jobacct_gather/none``; ``sacct`` then has nothing: job states come from ``scontrol show job``,
kept ``MinJobAge`` seconds after the job ends). The node is this machine (``NodeName=$(hostname)``,
``NodeAddr=127.0.0.1``) with its CPU count. Commands find the cluster through ``SLURM_CONF``
(``SlurmCluster.env``).

sshd (Debian's openssh-server): a host key and a client key made here, a non-default port on
127.0.0.1, ``AuthorizedKeysFile`` in the temporary directory. Clients reach it through an ``ssh``
wrapper placed first on ``PATH`` (``SshServer.env``) that adds ``-F`` with a config the test owns
(port, key, ``StrictHostKeyChecking no``, a known-hosts file here): OpenSSH reads ``~/.ssh/config``
from the password database, not ``$HOME``, and the deepspeed runner calls a bare ``ssh`` for its
reachability check, so the wrapper is the one way in that leaves ~/.ssh untouched. pdsh's ssh
module finds the wrapper through ``PATH`` too.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "pdsh", "openssh-server", "openssh-client")
BROWSER_PACKAGES = ("chromium",)
"""For tests/test_explain_html.py: headless Chromium renders ``dstk explain --html`` (22 s to install here)."""
SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol")
SSH_BINARIES = ("sshd", "ssh", "ssh-keygen", "pdsh")
SBIN = ("/usr/sbin", "/sbin")
PRIVSEP_DIR = "/run/sshd"


class Unavailable(Exception):
    """The service cannot run on this machine; the message says why (tests skip with it)."""


def which(name: str) -> str | None:
    return shutil.which(name) or next((f"{d}/{name}" for d in SBIN if os.access(f"{d}/{name}", os.X_OK)), None)


def install(binaries: tuple[str, ...] = SLURM_BINARIES + SSH_BINARIES, *, timeout_seconds: float = 900,
            packages: tuple[str, ...] = PACKAGES) -> None:
    """apt-get ``packages`` when a binary is missing (root only); raise ``Unavailable`` otherwise."""
    missing = [b for b in binaries if which(b) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise Unavailable(f"{', '.join(missing)} not installed, and apt-get as root is not available to install "
                          f"{' '.join(packages)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    deadline = time.monotonic() + timeout_seconds
    for argv in (["apt-get", "update", "-q"],
                 ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]):
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True,
                                  timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise Unavailable(f"`{' '.join(argv)}` took over {timeout_seconds:.0f} s") from None
        if done.returncode != 0:
            raise Unavailable(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    still = [b for b in binaries if which(b) is None]
    if still:
        raise Unavailable(f"{', '.join(still)} still missing after installing {' '.join(packages)}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, *, timeout_seconds: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    tail = ""
    if log is not None and log.is_file():
        tail = "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
    raise Unavailable(f"{what} not ready after {timeout_seconds:.0f} s{tail}")


def _pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def _stop_pids(pids: list[int], *, timeout_seconds: float = 10) -> None:
    """SIGTERM the daemons we started (by pid), then SIGKILL what is left after the timeout."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _run(argv: list[str], *, what: str, env: dict | None = None, timeout_seconds: float = 30) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"{what}: `{' '.join(argv)}` took over {timeout_seconds:.0f} s") from None
    if done.returncode != 0:
        raise Unavailable(f"{what}: `{' '.join(argv)}` exited {done.returncode}: {(done.stderr or done.stdout).strip()[-800:]}")
    return done


# --- Slurm ---------------------------------------------------------------------------------------

@dataclasses.dataclass(kw_only=True, slots=True)
class SlurmCluster:
    root: Path
    """The temporary directory holding every file of the cluster."""
    conf: Path
    partition: str
    node: str
    cpus: int
    """CPUs of the node (this machine's, as this process may use them)."""
    pid_files: tuple[Path, ...]

    @property
    def env(self) -> dict[str, str]:
        """Variables for Slurm commands (and, through sbatch's default ``--export=ALL``, for jobs)."""
        return {"SLURM_CONF": str(self.conf)}

    def command(self, *argv: str, timeout_seconds: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_seconds,
                              env={**os.environ, **self.env})

    def job_state(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as {key: value} (JobState, ExitCode, StdOut, ...); {} once forgotten."""
        done = self.command("scontrol", "show", "job", "--oneliner", job_id)
        if done.returncode != 0:
            return {}
        return dict(re.findall(r"(\w+)=(\S*)", done.stdout))

    def in_queue(self, job_id: str, *, timeout_seconds: float = 30) -> bool:
        """squeue lists the job (pending, running or completing); squeue errors (slurmctld busy on a
        loaded machine) are retried, not read as "gone"."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            done = self.command("squeue", "--noheader", "--jobs", job_id, "--format", "%i")
            if done.returncode == 0 or "Invalid job id" in done.stderr:
                return job_id in done.stdout.split()
            if time.monotonic() > deadline:
                raise AssertionError(f"squeue kept failing for {timeout_seconds:.0f} s: {done.stderr.strip()}")
            time.sleep(1)

    def wait_job(self, job_id: str, *, timeout_seconds: float) -> dict[str, str]:
        """Wait until squeue no longer lists the job; return its final ``scontrol`` record."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if not self.in_queue(job_id) and state.get("JobState") not in (None, "PENDING", "RUNNING", "COMPLETING",
                                                                            "CONFIGURING"):
                return state
            time.sleep(1)
        self.command("scancel", job_id)
        raise AssertionError(f"job {job_id} still queued after {timeout_seconds:.0f} s: {self.job_state(job_id)}")

    def stop(self) -> None:
        _stop_pids([p for p in map(_pid, self.pid_files) if p is not None])


def _slurm_conf(*, root: Path, node: str, cpus: int, memory_mb: int, ctld_port: int, slurmd_port: int,
                partition: str, munge_socket: Path, task_plugin: str) -> str:
    return f"""# a one-node test cluster (tests/services.py); every path is under {root}
ClusterName=dstktest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin={task_plugin}
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.log
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MinJobAge=600
KillWait=5
InactiveLimit=0
MpiDefault=none
SwitchType=switch/none
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName={partition} Nodes={node} Default=YES MaxTime=30 State=UP OverSubscribe=NO
"""


def start_slurm(root: Path, *, partition: str = "debug", task_plugin: str = "task/affinity",
                timeout_seconds: float = 60) -> SlurmCluster:
    """munged, slurmctld and slurmd for this machine as one node; raise ``Unavailable`` if they do not start."""
    if os.geteuid() != 0:
        raise Unavailable("slurmd must run as root to start jobs as the submitting user; these tests are not root")
    install(SLURM_BINARIES)
    root = Path(root)
    for sub in ("state", "spool", "munge"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    started: list[Path] = []
    cluster = None
    try:
        # munge: a key made for the test, its own socket; munged refuses root without --force.
        munge_dir = root / "munge"
        os.chmod(munge_dir, 0o700)
        key = munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        socket_path = munge_dir / "munge.socket"
        munge_pid = munge_dir / "munged.pid"
        started.append(munge_pid)
        _run([which("munged"), "--force", f"--key-file={key}", f"--socket={socket_path}",
              f"--pid-file={munge_pid}", f"--log-file={munge_dir / 'munged.log'}",
              f"--seed-file={munge_dir / 'munged.seed'}"], what="munged")
        _wait(socket_path.exists, timeout_seconds=timeout_seconds, what="munged", log=munge_dir / "munged.log")
        node = socket.gethostname().split(".")[0]
        memory_mb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1)) // 1024 // 2
        conf = root / "slurm.conf"
        cpus = len(os.sched_getaffinity(0))
        conf.write_text(_slurm_conf(root=root, node=node, cpus=cpus, memory_mb=memory_mb,
                                    ctld_port=free_port(), slurmd_port=free_port(), partition=partition,
                                    munge_socket=socket_path, task_plugin=task_plugin))
        env = {**os.environ, "SLURM_CONF": str(conf)}
        cluster = SlurmCluster(root=root, conf=conf, partition=partition, node=node, cpus=cpus,
                               pid_files=(root / "slurmd.pid", root / "slurmctld.pid", munge_pid))
        started[:] = []
        # -i: ignore state left by an earlier cluster; both daemonize and write their pid files.
        _run([which("slurmctld"), "-i", "-f", str(conf)], what="slurmctld", env=env)
        _run([which("slurmd"), "-f", str(conf)], what="slurmd", env=env)

        def node_idle() -> bool:
            done = cluster.command("sinfo", "--noheader", "--format", "%T", "--partition", partition)
            return done.returncode == 0 and done.stdout.strip() == "idle"

        _wait(node_idle, timeout_seconds=timeout_seconds, what="the Slurm node (sinfo: idle)",
              log=root / "slurmctld.log")
        return cluster
    except BaseException:
        if cluster is not None:
            cluster.stop()
        else:
            _stop_pids([p for p in map(_pid, started) if p is not None])
        raise


# --- sshd ----------------------------------------------------------------------------------------

@dataclasses.dataclass(kw_only=True, slots=True)
class SshServer:
    root: Path
    port: int
    bin_dir: Path
    """Holds the ``ssh`` wrapper; first on ``PATH`` in ``env``."""
    pid_file: Path
    made_run_dir: bool = False
    """``/run/sshd`` (sshd's privilege-separation directory) was made here; ``stop`` removes it."""

    @property
    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}

    def stop(self) -> None:
        pid = _pid(self.pid_file)
        if pid is not None:
            _stop_pids([pid])
        if self.made_run_dir:
            try:
                os.rmdir(PRIVSEP_DIR)
            except OSError:  # another sshd put something there since
                pass


def start_sshd(root: Path, *, timeout_seconds: float = 30) -> SshServer:
    """sshd on 127.0.0.1:<free port> accepting a key made here; ``ssh`` wrapper with the test's config."""
    if os.geteuid() != 0:
        raise Unavailable("sshd must run as root to log in as this user without touching ~/.ssh; not root")
    install(SSH_BINARIES)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    for name, kind in (("host_key", "ed25519"), ("client_key", "ed25519")):
        _run([which("ssh-keygen"), "-q", "-t", kind, "-N", "", "-f", str(root / name)], what="ssh-keygen")
    (root / "authorized_keys").write_text((root / "client_key.pub").read_text())
    os.chmod(root / "authorized_keys", 0o600)
    port = free_port()
    pid_file = root / "sshd.pid"
    (root / "sshd_config").write_text(f"""# tests/services.py: loopback only, this key only
ListenAddress 127.0.0.1:{port}
HostKey {root / 'host_key'}
PidFile {pid_file}
AuthorizedKeysFile {root / 'authorized_keys'}
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
AllowTcpForwarding no
X11Forwarding no
PrintMotd no
# TORCH_EXTENSIONS_DIR: a test gives the "remote" hosts a cache of their own (SetEnv in its ssh_config)
AcceptEnv LANG LC_* TORCH_EXTENSIONS_DIR
LogLevel ERROR
""")
    (root / "ssh_config").write_text(f"""# tests/services.py: the client side of the test sshd
Host localhost 127.0.0.1
    Port {port}
    IdentityFile {root / 'client_key'}
    IdentitiesOnly yes
    StrictHostKeyChecking no
    UserKnownHostsFile {root / 'known_hosts'}
    BatchMode yes
    LogLevel ERROR
""")
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "ssh"
    wrapper.write_text(f"#!/bin/sh\nexec {which('ssh')} -F {root / 'ssh_config'} \"$@\"\n")
    wrapper.chmod(0o755)
    # Privilege separation needs /run/sshd (the package's service unit makes it; no init runs here).
    made_run_dir = not os.path.isdir(PRIVSEP_DIR)
    if made_run_dir:
        os.mkdir(PRIVSEP_DIR, 0o755)
    server = SshServer(root=root, port=port, bin_dir=bin_dir, pid_file=pid_file, made_run_dir=made_run_dir)
    try:
        _run([which("sshd"), "-f", str(root / "sshd_config"), "-E", str(root / "sshd.log")], what="sshd")
    except BaseException:
        server.stop()
        raise

    def logs_in() -> bool:
        done = subprocess.run(["ssh", "127.0.0.1", "true"], capture_output=True, timeout=10,
                              env={**os.environ, **server.env})
        return done.returncode == 0

    try:
        _wait(logs_in, timeout_seconds=timeout_seconds, what="sshd (ssh 127.0.0.1 true)", log=root / "sshd.log")
    except BaseException:
        server.stop()
        raise
    return server


def sshd_fixture(*, scope: str = "module"):
    """A pytest fixture (assign it in a test module: ``sshd = sshd_fixture()``) yielding an ``SshServer``,
    or skipping with the reason where sshd cannot start. pytest is imported here, not at the top:
    CI runs this file with the system python to install the packages."""
    import pytest

    @pytest.fixture(scope=scope)
    def sshd(tmp_path_factory):
        try:
            server = start_sshd(tmp_path_factory.mktemp("sshd"))
        except Unavailable as exc:
            pytest.skip(f"no sshd: {exc}")
        yield server
        server.stop()

    return sshd


def ssh_with_env(server: "SshServer", directory: Path, **env: str) -> Path:
    """A directory (made under ``directory``) holding an ``ssh`` that reaches ``server`` and sets ``env`` in the
    remote commands' environment (ssh's SetEnv: a node's own login environment, which this machine's does not
    reach; the test sshd accepts TORCH_EXTENSIONS_DIR), to put first on PATH."""
    config = directory / "ssh_config"
    set_env = "".join(f"    SetEnv {k}={v}\n" for k, v in env.items())
    config.write_text((server.root / "ssh_config").read_text().replace("    BatchMode yes\n",
                                                                        f"    BatchMode yes\n{set_env}"))
    bin_dir = directory / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ssh").write_text(f"#!/bin/sh\nexec {shutil.which('ssh')} -F {config} \"$@\"\n")
    (bin_dir / "ssh").chmod(0o755)
    return bin_dir


def generate_tiny_run(root: Path, *flags: str, repo: Path, timeout_seconds: float = 120) -> Path:
    """The README's tiny example (``examples/intents/tiny-llama-cpu.yaml``) generated under ``root/run``
    with ``flags`` added (none: 1 node, 2 CPU ranks)."""
    done = subprocess.run([sys.executable, "-m", "dstk", "generate", str(repo / "examples" / "intents" / "tiny-llama-cpu.yaml"),
                           *flags, "--output", str(root / "run")], capture_output=True, text=True, timeout=timeout_seconds)
    if done.returncode != 0:
        raise AssertionError(done.stderr)
    return root / "run"


def generate_two_node_run(root: Path, *, repo: Path, timeout_seconds: float = 120) -> tuple[Path, Path]:
    """The tiny example generated for 2 nodes x 1 rank under ``root/run``, and ``root/hostfile`` naming this
    machine twice (``localhost`` and ``127.0.0.1``: two "nodes" that pdsh reaches over the test sshd)."""
    generate_tiny_run(root, "--nodes", "2", "--gpus-per-node", "1", repo=repo, timeout_seconds=timeout_seconds)
    hostfile = root / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    return root / "run", hostfile


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        raise SystemExit("usage: python tests/services.py install")
    try:
        install()
    except Unavailable as exc:
        print(f"services: not installed ({exc}); the Slurm and pdsh tests will skip", file=sys.stderr)
    else:
        print("services: slurm, munge, pdsh and sshd are installed")
    try:  # apart, so that a machine without a chromium package still gets Slurm and sshd
        install(("chromium",), packages=BROWSER_PACKAGES)
    except Unavailable as exc:
        print(f"services: chromium not installed ({exc}); the browser tests of explain --html will skip",
              file=sys.stderr)
    else:
        print("services: chromium is installed")
