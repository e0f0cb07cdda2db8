"""One rank of tests/test_shm_cleanup.py: join DeepSpeed's gloo group (which creates this rank's
/dev/shm all-reduce buffer), all-reduce once, say whether the buffer exists, end with argv[1]."""

import os
import sys

import deepspeed
import deepspeed.comm as dist
import torch

code = int([a for a in sys.argv[1:] if not a.startswith("--")][0])
deepspeed.init_distributed(dist_backend="gloo")
t = torch.ones(4)
dist.all_reduce(t)
name = (f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_{os.environ['MASTER_ADDR']}_"
        f"{os.environ['MASTER_PORT']}_{os.environ['RANK']}")
print(f"sum={t[0].item():g} buffer={name} exists={os.path.exists(name)}", flush=True)

from dstk.launch.rank import exit_rank  # noqa: E402

exit_rank(code)
