"""Rank 1 fails the way it is told (argv[1]: "exit", "sigkill" or "oom": an allocation no host can
serve); the other ranks wait to be stopped. "rendezvous": every rank joins a gloo group at
MASTER_ADDR:MASTER_PORT (the test holds the port)."""

import os
import signal
import sys
import time

mode = [a for a in sys.argv[1:] if not a.startswith("--")][0]
print(f"started rank={os.environ['RANK']} env={os.environ.get('DSTK_TEST_VALUE')!r}", flush=True)
if mode == "ok":
    sys.exit(0)
if mode == "rendezvous":
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
    sys.exit(0)
if os.environ["RANK"] == "1":
    time.sleep(0.5)
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "oom":
        import torch

        torch.empty(2**47, dtype=torch.uint8)  # 128 TiB: the CPU allocator refuses it
    print("rank 1 gives up", file=sys.stderr, flush=True)
    sys.exit(7)
time.sleep(60)
