"""Run inside a private /dev/shm (tests/test_shm_cleanup.py starts it under ``unshare --mount`` with a
fresh tmpfs there, so other test sessions sweeping /dev/shm cannot blur what dstk removed).

argv: RUN_DIR PORT CODE: map a "live run" buffer under PORT, launch tests/data/shm/shm_rank.py CODE
on RUN_DIR with dstk, then print one JSON line: the launch's exit code, output, and what is left."""

import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

run_dir, port, code = sys.argv[1], sys.argv[2], sys.argv[3]
script = Path(__file__).with_name("shm_rank.py")
live = Path(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{port}_5")
live.write_bytes(b"\0" * 4096)
with open(live, "r+b") as f:
    mapping = mmap.mmap(f.fileno(), 0)  # a live run's buffer: mapped, so never removed
done = subprocess.run([sys.executable, "-m", "dstk", "launch", run_dir, "--master-port", port, "--", str(script), code],
                      capture_output=True, text=True, timeout=280)
left = sorted(str(p) for p in Path("/dev/shm").iterdir())
mapping.close()
print("RESULT " + json.dumps({"rc": done.returncode, "out": done.stdout + done.stderr, "left": left,
                              "live": str(live)}))
