"""One rank of the offload-traffic check (``tests/test_offload_traffic.py``): for each case (ZeRO
stage, ``offload_param`` on or off, gradient accumulation steps m), ``deepspeed.initialize`` a tiny
bf16 Llama with the optimizer offloaded to the CPU (the real DeepSpeedCPUAdam), train one step to
create the optimizer states, then count, over the m forward/backward passes and the
``engine.step()`` of the second step, the bytes DeepSpeed moves between host and device.

On these CPU machines host and "device" are one memory, so a copy cannot be told by its device.
It is told by its buffers instead: the host-resident ones DeepSpeed allocates for offload (ZeRO-1/2:
the fp32 partition and its gradient, the bf16 staging buffer, ``accumulated_grads_in_cpu``; ZeRO-3:
the fp32 partition and its gradient, ``grad_partitions_flat_buffer``, and under ``offload_param``
the bf16 partitions the parameters' ``ds_tensor`` point into). A Wrapping
``torch.Tensor.copy_`` and ``torch.Tensor.to`` (``CountCopies``) sees every copy DeepSpeed calls:
- ``dst.copy_(src)`` with dst host and src not: device -> host, ``numel x`` the dtype that crosses
  (the source's, or the destination's when ``non_blocking``: torch converts on the GPU then);
- ``dst.copy_(src)`` with src host and dst not: host -> device, ``numel x`` the destination's dtype
  (torch converts host -> device copies on the CPU, ``copy_kernel_cuda``);
- ``host.to(device[, dtype])``: host -> device, ``numel x`` the target dtype (the moves DeepSpeed
  writes as ``.to(grad_partition.device)`` / ``.to(current_device_name())``; on a GPU a new device
  tensor, here a no-op, so only the call can be counted).
Rank 0 prints one JSON line: per case the counted bytes each way with the rank's partition sizes.
Started through ``tests/dist.py``."""

from __future__ import annotations

import json
import os
import sys

import deepspeed
import torch
from deepspeed.accelerator import get_accelerator
from transformers import LlamaConfig, LlamaForCausalLM

SEQ = 16


def _ptr(t) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:
        return None


def _host_tensors(opt) -> list:
    """The host-resident offload buffers of DeepSpeed's ZeRO optimizer ``opt`` (see the module doc)."""
    out: list = []
    if hasattr(opt, "single_partition_of_fp32_groups"):  # ZeRO-1/2 (stage_1_and_2.py)
        for t in opt.single_partition_of_fp32_groups:
            out += [t, t.grad]
        out += list(getattr(opt, "param_buffer_of_bit16_for_cpu_offload_groups", []))
        out += list(getattr(opt, "accumulated_grads_in_cpu", {}).values())
        out.append(getattr(opt, "temp_grad_buffer_for_cpu_offload", None))
    else:  # ZeRO-3 (stage3.py)
        for t in opt.fp32_partitioned_groups_flat:
            out += [t, t.grad]
        out.append(opt.grad_partitions_flat_buffer)
        if opt.offload_param:
            out += [t for t in opt.fp16_partitioned_groups_flat if t is not None]
            out += [p.ds_tensor for group in opt.fp16_groups for p in group]
    return [t for t in out if t is not None]


class CountCopies:
    """Adds up the host <-> device bytes of the copies DeepSpeed issues (module doc), by wrapping
    ``torch.Tensor.copy_`` and ``torch.Tensor.to`` while installed. (Not a ``TorchFunctionMode``:
    torch turns modes off inside an ``autograd.Function``'s backward, where ZeRO-3's pre-backward
    hook gathers the parameters.) ``sites``: bytes by direction and DeepSpeed file:line."""

    def __init__(self, opt):
        self.opt = opt
        self.down = 0
        self.up = 0
        self.sites: dict[str, int] = {}
        self._real = (torch.Tensor.copy_, torch.Tensor.to)

    def host(self, t) -> bool:
        p = _ptr(t)
        return p is not None and p in {_ptr(h) for h in _host_tensors(self.opt)}

    def _add(self, kind: str, nbytes: int) -> None:
        if kind == "down":
            self.down += nbytes
        else:
            self.up += nbytes
        frame = sys._getframe(2)
        site = f"{kind} {os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
        self.sites[site] = self.sites.get(site, 0) + nbytes

    def __enter__(self):
        real_copy, real_to = self._real

        def copy_(dst, src, non_blocking=False):
            if isinstance(src, torch.Tensor):
                dst_host, src_host = self.host(dst), self.host(src)
                if dst_host and not src_host:
                    self._add("down", dst.numel() * (dst.dtype if non_blocking else src.dtype).itemsize)
                elif src_host and not dst_host:
                    self._add("up", dst.numel() * dst.dtype.itemsize)
            return real_copy(dst, src, non_blocking)

        def to(t, *args, **kwargs):
            device, dtype = kwargs.get("device"), kwargs.get("dtype")
            for a in args:
                if isinstance(a, (str, torch.device)):
                    device = a
                elif isinstance(a, torch.dtype):
                    dtype = a
            if device is not None and self.host(t):
                self._add("up", t.numel() * (dtype or t.dtype).itemsize)
                # On a GPU a new device tensor; here ``.to("cpu")`` would return the host buffer
                # itself, and DeepSpeed's add-then-copy-back would read and write one tensor.
                return real_to(t, dtype=dtype or t.dtype, copy=True)
            return real_to(t, *args, **kwargs)

        torch.Tensor.copy_, torch.Tensor.to = copy_, to
        return self

    def __exit__(self, *exc):
        torch.Tensor.copy_, torch.Tensor.to = self._real
        return False


def run(case: dict) -> dict:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    m = case["m"]
    zero: dict = {"stage": case["zero"], "offload_optimizer": {"device": "cpu", "pin_memory": True},
                  "overlap_comm": True, "contiguous_gradients": True}
    if case["zero"] == 3:
        # Every parameter gathered in its module's forward and again in its backward (no persistent
        # parameters, no reuse across the turn, no prefetch), so the gathers are two passes.
        zero.update(stage3_param_persistence_threshold=0, stage3_max_reuse_distance=0,
                    stage3_prefetch_bucket_size=0)
        if case.get("offload_param"):
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": m,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": zero, "bf16": {"enabled": True}}
    if case.get("grad_accum_dtype"):
        config["data_types"] = {"grad_accum_dtype": case["grad_accum_dtype"]}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    opt = engine.optimizer
    ids = torch.randint(0, cfg.vocab_size, (1, SEQ))

    def one_step():
        for _ in range(m):
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()

    counter = CountCopies(opt)
    # DeepSpeed branches on where a buffer lives (stage3.py:2029 ``on_accelerator(grad_buffer)``
    # adds in place when the gradient buffer is on the device, else copies it up, adds, copies it
    # back): the CPU accelerator calls every CPU tensor "on the accelerator", so the host buffers
    # are made to say what they say on a GPU.
    accel = get_accelerator()
    real = accel.on_accelerator
    accel.on_accelerator = lambda t: real(t) and not counter.host(t)
    try:
        one_step()  # creates the optimizer states
        with counter:
            one_step()
    finally:
        accel.on_accelerator = real
    out = {"down_bytes": counter.down, "up_bytes": counter.up, "sites": counter.sites}
    if case["zero"] == 3:
        params = [p for group in opt.fp16_groups for p in group]
        out["partition_numel"] = sum(p.partition_numel() for p in params)
        # grads with real data in this rank's partition (partition_grads skips padding-only ones)
        rank = torch.distributed.get_rank()
        out["grad_numel"] = sum(p.partition_numel() for p in params
                                if p.partition_numel() * rank < p.ds_numel)
    else:
        out["partition_numel"] = int(sum(int(s) for s in opt.partition_size))
        out["in_partition_numel"] = sum(p.numel() for group in opt.params_in_partition for p in group)
        out["grad_numel"] = sum(int(v[3]) for v in opt.grad_position.values())
    return out


def main() -> None:
    cases = json.loads(sys.argv[1])
    out = [run(case) for case in cases]
    if int(os.environ.get("RANK", "0")) == 0:
        print("TRAFFIC " + json.dumps(out), flush=True)
    from dstk.launch.rank import exit_rank

    exit_rank()


if __name__ == "__main__":
    main()
