"""Rank 1 fails the way it is told (argv[1]: "exit" or "sigkill"); the other ranks wait to be stopped."""

import os
import signal
import sys
import time

mode = [a for a in sys.argv[1:] if not a.startswith("--")][0]
print(f"started rank={os.environ['RANK']} env={os.environ.get('DSTK_TEST_VALUE')!r}", flush=True)
if mode == "ok":
    sys.exit(0)
if os.environ["RANK"] == "1":
    time.sleep(0.5)
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    print("rank 1 gives up", file=sys.stderr, flush=True)
    sys.exit(7)
time.sleep(60)
