"""What one host has: ``python -m dstk.launch.probe`` prints one JSON object.

Run locally and, over ssh, on every host of a hostfile by ``dstk doctor``; each field is
``None`` when unknown (not ``-1``), with the reason under ``errors``. ``--locks [ROOT]``: only the
stale op-build locks (``DSTK_STALE_LOCKS {"root": ..., "stale": [...]}``, no torch import), what ``dstk launch``
asks every node of a pdsh launch before it starts (``dstk.launch.locks.remote_stale_locks``).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys


def probe() -> dict:
    info: dict = {"host": socket.gethostname(), "python": platform.python_version(), "executable": sys.executable,
                  "torch": None, "deepspeed": None, "cuda": None, "nccl": None, "accelerator": None,
                  "num_devices": None, "device_name": None, "num_cpus": os.cpu_count(), "errors": []}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            info["num_devices"] = torch.cuda.device_count()
            info["device_name"] = torch.cuda.get_device_name(0)
            info["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    except Exception as exc:  # report, do not crash: this is a diagnosis tool
        info["errors"].append(f"torch: {type(exc).__name__}: {exc}")
    try:
        import deepspeed
        from deepspeed.accelerator import get_accelerator

        info["deepspeed"] = deepspeed.__version__
        accel = get_accelerator()
        info["accelerator"] = accel.device_name()
        info["backend"] = accel.communication_backend_name()
        if info["num_devices"] is None:
            info["num_devices"] = accel.device_count()
    except Exception as exc:
        info["errors"].append(f"deepspeed: {type(exc).__name__}: {exc}")
    try:
        # a launch on this host would wait for these forever (dstk.launch.locks): the doctor names them per host
        found = stale_locks()
        info["extensions_root"], info["stale_locks"] = found["root"], found["stale"]
    except Exception as exc:
        info["errors"].append(f"op-build locks: {type(exc).__name__}: {exc}")
    return info


def stale_locks(root: str | None = None) -> dict:
    """This host's cache (``root``, else ``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``) and the
    stale op-build locks in it, without torch."""
    from pathlib import Path

    from dstk.launch.locks import extensions_root, find_stale_locks

    where = Path(root) if root else extensions_root()
    return {"root": str(where), "stale": [str(p) for p in find_stale_locks(where)]}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--locks"]:
        from dstk.launch.locks import LOCKS_TAG

        print(LOCKS_TAG + json.dumps(stale_locks(*sys.argv[2:3])))
    else:
        print(json.dumps(probe()))
