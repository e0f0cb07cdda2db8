"""Real DeepSpeed training steps (--steps, default 1) on this rank (gloo on CPU, NCCL on GPU): started by `dstk launch` in tests."""

import argparse
import os

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from dstk.launch.rank import exit_rank

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)
parser.add_argument("--deepspeed_config", required=True)
parser.add_argument("--steps", type=int, default=1)
args = parser.parse_args()

deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=args.deepspeed_config)
torch.manual_seed(1 + dist.get_rank())
dtype = next(engine.module.parameters()).dtype  # bf16 when the config says so
x = torch.randn(engine.train_micro_batch_size_per_gpu(), 8).to(engine.device, dtype)
y = torch.randn(engine.train_micro_batch_size_per_gpu(), 1).to(engine.device, dtype)
before = [p.detach().clone() for p in engine.module.parameters()]
for _ in range(args.steps):  # a warm-up schedule may start at lr 0: take enough steps to move
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
changed = any(not torch.equal(a, b) for a, b in zip(before, engine.module.parameters()))
# Data parallel: after the step every rank holds the same weights.
flat = torch.cat([p.detach().flatten() for p in engine.module.parameters()])
gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, flat)
same = all(torch.equal(gathered[0], g) for g in gathered)
print(f"STEP rank={dist.get_rank()} world={dist.get_world_size()} node={os.environ.get('CROSS_RANK')} "
      f"backend={dist.get_backend()} "
      f"loss={loss.item():.6f} changed={changed} same={same}", flush=True)
exit_rank()  # barrier, destroy the group, leave without the gloo exit-time abort
