"""DeepSpeed's shared-memory all-reduce buffers in /dev/shm: find them, free the ones a run left.

DeepSpeed 0.19.8's CPU all-reduce (``deepspeed/ops/csrc/cpu/comm/shm.cpp``) runs when every rank is
on one machine (``LOCAL_SIZE == world size``, ``shm_interface.cpp`` lines 31-46). ``shm_initialize``
(shm.cpp line 340) names each rank's buffer

    deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>      (shm.cpp lines 350-367)

creates it with ``shm_open(O_CREAT)`` and ``write``s one ``struct allreduce_workspace`` into it
(shm.cpp lines 69-77, 95-102): two coll_state enums plus 2 x 1 MiB + 2 x 32 MiB of buffers,
69,206,024 bytes (66 MiB). Only ``shared_close`` calls ``shm_unlink`` (line 83), and nothing calls
``shared_close``: every run leaks one buffer per rank until the machine reboots. The name holds the
uid and the rendezvous port, so a launcher can free exactly its own run's buffers once its ranks
are gone.

A buffer is in use while some live process maps it *or holds it open*. Mapped alone is not enough:
``shared_create`` writes the 66 MiB into the new file through its descriptor and maps it only
afterwards (by name, with a second ``shm_open``), and a peer rank waits for the name to appear
(``shm_initialize``'s ``while (... errno == ENOENT)`` loop, shm.cpp line 400). A sweep that unlinks
an unmapped file in that window leaves the creator unmapped and its peer spinning forever; seen
here with 8 test sessions sweeping /dev/shm on a loaded machine (ranks spinning for 10 minutes,
``/proc/PID/fd`` -> ``deepspeed_allreduce_buffer_... (deleted)``). The descriptor is open from
``shm_open(O_CREAT)`` on and never closed, so "open or mapped" has no window.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from pathlib import Path

from dstk.launch.locks import open_files

SHM_DIR = "/dev/shm"
"""Where glibc's ``shm_open`` puts POSIX shared memory on Linux."""


def default_dir() -> str:
    """``SHM_DIR``, or ``$DSTK_SHM_DIR`` (tests point it at a private directory: other test sessions on the
    same machine remove unmapped buffers in /dev/shm at any moment)."""
    return os.environ.get("DSTK_SHM_DIR") or SHM_DIR
PREFIX = "deepspeed_allreduce_buffer"
BUFFER_BYTES = 2 * 4 + 2 * 2**20 + 2 * 32 * 2**20
"""One rank's buffer: ``sizeof(struct allreduce_workspace)`` = 2 enum states + 2 x NAIVE_ALLREDUCE_THRESHOLD
(1 MiB) + 2 x MAX_BUF_SIZE (32 MiB) (shm.cpp lines 91-102) = 69,206,024 B."""
# uid, then MASTER_ADDR (anything, also empty), then MASTER_PORT (digits, or empty when unset), then the rank.
_NAME_RE = re.compile(rf"^{PREFIX}_(\d+)_(.*)_(\d*)_(\d+)$")


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class ShmBuffer:
    path: str
    uid: int
    master_addr: str
    master_port: int | None
    rank: int
    size_bytes: int
    in_use: bool
    """Some live process maps it or holds it open (a running job, or one starting): never removed."""


def parse_name(name: str) -> tuple[int, str, int | None, int] | None:
    """(uid, master_addr, master_port, rank) of a buffer's file name; None for other files."""
    m = _NAME_RE.match(name)
    if m is None:
        return None
    return int(m.group(1)), m.group(2), int(m.group(3)) if m.group(3) else None, int(m.group(4))


def in_use_paths(*, proc_dir: str = "/proc", needle: str = PREFIX) -> set[str]:
    """Paths holding ``needle`` that some process we can see maps (``/proc/PID/maps``) or holds open
    (``/proc/PID/fd``)."""
    used = {target.removesuffix(" (deleted)") for target in open_files(proc_dir=proc_dir) if needle in target}
    try:
        pids = [p for p in os.listdir(proc_dir) if p.isdigit()]
    except OSError:
        return used
    for pid in pids:
        try:
            with open(f"{proc_dir}/{pid}/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    if needle in line:
                        # "addr perms offset dev inode path" (+ " (deleted)" once unlinked)
                        used.add(line.split(None, 5)[-1].strip().removesuffix(" (deleted)"))
        except OSError:
            continue
    return used


def list_buffers(*, shm_dir: str | None = None) -> list[ShmBuffer]:
    """Every DeepSpeed all-reduce buffer in ``shm_dir``, with whether a live process uses it."""
    shm_dir = shm_dir or default_dir()
    try:
        names = sorted(n for n in os.listdir(shm_dir) if n.startswith(PREFIX))
    except OSError:
        return []
    if not names:
        return []
    used = in_use_paths()  # after the listing: a file created since is not in it
    found = []
    for name in names:
        parsed = parse_name(name)
        if parsed is None:
            continue
        path = os.path.join(shm_dir, name)
        try:
            size = os.stat(path).st_size
        except OSError:
            continue
        uid, addr, port, rank = parsed
        found.append(ShmBuffer(path=path, uid=uid, master_addr=addr, master_port=port, rank=rank, size_bytes=size,
                               in_use=path in used))
    return found


def leaked_buffers(*, shm_dir: str | None = None, uid: int | None = None) -> list[ShmBuffer]:
    """Buffers no live process maps or holds open (left by finished or killed runs); only ``uid``'s when given."""
    shm_dir = shm_dir or default_dir()
    return [b for b in list_buffers(shm_dir=shm_dir) if not b.in_use and (uid is None or b.uid == uid)]


def remove_run_buffers(*, master_port: int, uid: int | None = None, shm_dir: str | None = None) -> list[str]:
    """Unlink the buffers of the run that used ``master_port`` (this user's) that no process uses.

    Called when a launch ends (success or failure): its ranks are gone, so its buffers are unmapped;
    another live run cannot hold the same port (its rendezvous store binds it), and a buffer that
    is still in use is skipped anyway. Returns the removed paths."""
    shm_dir = shm_dir or default_dir()
    uid = os.getuid() if uid is None else uid
    removed = []
    for buf in list_buffers(shm_dir=shm_dir):
        if buf.in_use or buf.uid != uid or buf.master_port != master_port:
            continue
        try:
            os.unlink(buf.path)
            removed.append(buf.path)
        except OSError:  # another user's file, or gone already
            continue
    return removed


def remove_leaked(buffers: list[ShmBuffer]) -> list[str]:
    """Unlink the given buffers that are still unused (checked again just before)."""
    used = in_use_paths()
    removed = []
    for buf in buffers:
        if buf.path in used:
            continue
        try:
            os.unlink(buf.path)
            removed.append(buf.path)
        except OSError:
            continue
    return removed


def rm_command(buffers: list[ShmBuffer]) -> str:
    return shlex.join(["rm", "-f", *(b.path for b in buffers)])


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class ShmSpace:
    path: str
    total_bytes: int
    free_bytes: int


def shm_space(path: str | None = None) -> ShmSpace | None:
    """Size and free space of the /dev/shm file system (``statvfs``); None when there is none."""
    path = path or default_dir()
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return ShmSpace(path=path, total_bytes=st.f_blocks * st.f_frsize, free_bytes=st.f_bavail * st.f_frsize)


def buffer_path(*, master_addr: str, master_port: int, rank: int, uid: int | None = None,
                shm_dir: str | None = None) -> Path:
    """Where rank ``rank`` of a run on ``master_addr:master_port`` puts its buffer (shm.cpp lines 350-367)."""
    shm_dir = shm_dir or default_dir()
    uid = os.getuid() if uid is None else uid
    return Path(shm_dir) / f"{PREFIX}_{uid}_{master_addr}_{master_port}_{rank}"
