"""A ``LaunchSpec`` from a run directory (docs/contracts.md) and the command-line choices."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from dstk.errors import DstkError, UsageError
from dstk.findings import has_errors, render_text
from dstk.launch.command import LaunchSpec
from dstk.launch.env import load_profile
from dstk.launch.hosts import Host, check_hostfile, parse_hosts_flag


def free_port() -> int:
    """A TCP port the OS says is free on this machine now."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def read_plan(run_dir: str | os.PathLike) -> dict:
    """``plan.json``'s cluster and layout, checked: world size = dp*tp*pp = nodes * GPUs per node."""
    path = Path(run_dir) / "plan.json"
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no plan.json in the run directory",
                         hint="create the run directory with `dstk generate ... --output DIR`") from None
    except (OSError, ValueError) as exc:
        raise DstkError(f"{path}: cannot read plan.json: {exc}", hint="regenerate it with `dstk generate`") from None
    try:
        cluster, layout = plan["cluster"], plan["layout"]
        nodes, per_node = int(cluster["num_nodes"]), int(cluster["gpus_per_node"])
        layout_world = int(layout["dp"]) * int(layout.get("tp", 1)) * int(layout.get("pp", 1))
    except (KeyError, TypeError, ValueError) as exc:
        raise DstkError(f"{path}: missing or bad cluster/layout field ({exc})",
                        hint="regenerate it with `dstk generate`") from None
    if nodes < 1 or per_node < 1 or layout_world != nodes * per_node:
        raise DstkError(f"{path}: layout dp*tp*pp = {layout_world} but cluster has {nodes} x {per_node} = {nodes * per_node} ranks",
                        hint="regenerate the run directory with `dstk generate`")
    return plan


def refuse_link_outside(path: Path, *, run_dir: Path) -> None:
    """A run directory is what every node reads: a file in it that is a symlink to a file outside it
    (another run's config, a path only this machine has, the original of a copied run) makes the
    ranks train with a config the plan and validate never saw. Links inside the directory are fine."""
    if not path.is_symlink():
        return
    target, home = path.resolve(), Path(run_dir).resolve()
    if target != home and home not in target.parents:
        raise DstkError(f"{path}: a symlink to {target}, outside the run directory {home}",
                        hint=f"copy the file in: `cp --remove-destination {target} {path}`, then "
                             f"`dstk validate {path}`; or regenerate the run directory with `dstk generate`")


MAX_HOSTFILE_BYTES = 1 << 20
"""A hostfile of a million bytes lists thousands of nodes; more is not a hostfile (``/dev/zero``)."""


def load_hostfile(path: str | os.PathLike) -> list[Host]:
    import stat

    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise UsageError(f"hostfile {path} is not a regular file", hint="give the path of a text file "
                             "with lines 'HOST slots=N'")
        with open(path, "rb") as f:
            data = f.read(MAX_HOSTFILE_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read hostfile {path}: {exc.strerror or exc}", hint="check the path") from None
    if len(data) > MAX_HOSTFILE_BYTES:
        raise UsageError(f"hostfile {path} is larger than {MAX_HOSTFILE_BYTES:,} bytes",
                         hint="a hostfile has one short line per node: check the path")
    try:
        # The runner reads it in text mode: universal newlines (\n, \r\n, \r), UTF-8 here.
        text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as exc:
        raise DstkError(f"hostfile {path} is not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r})",
                        hint="write the hostfile as plain text, one 'HOST slots=N' per line", location=str(path)) from None
    hosts, findings = check_hostfile(text)
    if has_errors(findings):
        raise DstkError("the hostfile has errors:\n" + render_text(str(path), findings),
                        hint="each line is 'HOST slots=N'; '#' starts a comment")
    for f in findings:  # warnings: the runner would ignore the text silently
        print(render_text(str(path), [f]), file=sys.stderr)
    return hosts


def spec_from_run_dir(
    run_dir: str | os.PathLike,
    *,
    script: str,
    script_args: list[str] | tuple[str, ...] = (),
    module: bool = False,
    hostfile: str | None = None,
    hosts: str | None = None,
    include: str = "",
    exclude: str = "",
    launcher: str | None = None,
    nccl_profile: str | None = None,
    env: dict[str, str] | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    node_rank: int | None = None,
    config_arg: str | None = "--deepspeed_config",
    prefix_output: bool = True,
) -> LaunchSpec:
    """Read ``plan.json`` in ``run_dir`` and combine it with the choices of ``dstk launch``.

    Environment order (later wins): the NCCL profile, ``OMP_NUM_THREADS`` for CPU ranks (cores
    divided among them, unless already set), then ``env``."""
    run_dir = Path(run_dir).resolve()
    plan = read_plan(run_dir)
    cluster = plan["cluster"]
    if hostfile and hosts:
        raise UsageError("--hostfile and --hosts cannot be combined", hint="use one of them")
    host_list: list[Host] = []
    hostfile_path, write = None, False
    if hostfile:
        host_list, hostfile_path = load_hostfile(hostfile), str(Path(hostfile).resolve())
    elif hosts:
        host_list, hostfile_path, write = parse_hosts_flag(hosts), str(run_dir / "hostfile"), True
    cpu = cluster.get("gpu") == "cpu"
    merged: dict[str, str] = {}
    if nccl_profile:
        merged.update(load_profile(nccl_profile))
    per_node = int(cluster["gpus_per_node"])
    if cpu and "OMP_NUM_THREADS" not in os.environ:
        # torch starts one thread per core in every rank; N ranks on a node would oversubscribe it N-fold.
        merged["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // per_node))
    merged.update(env or {})
    ds_config = run_dir / "ds_config.json"
    if not ds_config.is_file():
        raise UsageError(f"{ds_config}: no ds_config.json in the run directory",
                         hint="create the run directory with `dstk generate ... --output DIR`")
    refuse_link_outside(ds_config, run_dir=run_dir)
    if launcher is None:
        launcher = "pdsh" if host_list and node_rank is None else "local"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible and not cpu and not host_list and not include and not exclude and launcher == "local":
        # The runner drops CUDA_VISIBLE_DEVICES when --num_gpus is given and takes GPUs 0..N-1
        # (DeepSpeed#7155); pass the scheduler's GPUs on as the --include it would have made.
        include = f"localhost:{visible}"
    return LaunchSpec(
        script=script, script_args=tuple(script_args), module=module,
        num_nodes=int(cluster["num_nodes"]), gpus_per_node=per_node,
        hosts=tuple(host_list), hostfile=hostfile_path, write_hostfile=write,
        include=include, exclude=exclude, launcher=launcher,
        master_addr=master_addr, master_port=master_port if master_port is not None else free_port(),
        node_rank=node_rank, env=merged, ds_config=str(ds_config), config_arg=config_arg,
        prefix_output=prefix_output, cpu=cpu, run_dir=str(run_dir),
    )
