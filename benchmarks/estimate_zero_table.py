"""The ZeRO paper's per-device memory table (Rajbhandari et al. 2020, Table 1: Psi = 7.5B,
K = 12), next to DeepSpeed's own estimators and dstk's DeepSpeed-accurate model states.

    .venv/bin/python benchmarks/estimate_zero_table.py

Columns per N_d: the paper's accounting (``memory.zero_paper_bytes``), DeepSpeed 0.19.8's
``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs`` (no offload),
and dstk's ``memory.model_states`` (+ ZeRO-3's persistent/live terms left out, to compare like
with like). GB = 1e9 bytes, as in the paper. docs/estimate.md explains each difference.
"""

from __future__ import annotations

from dstk.estimate import memory as mem

PSI = 7.5e9
LARGEST_LAYER = 4096 * 4 * 4096  # an MLP matrix of a 7.5B GPT (h = 4096): DeepSpeed's "largest layer"
PAPER = {  # Table 1 of the paper, 7.5B column: N_d -> (P_os, P_os+g, P_os+g+p) in GB
    4: (52.5, 41.3, 30.0), 16: (35.6, 21.6, 7.5), 64: (31.4, 16.6, 1.88), 256: (30.4, 15.4, 0.47),
    1024: (30.1, 15.1, 0.12),
}


def main() -> None:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    print(f"{'N_d':>5} | {'paper os':>8} {'os+g':>6} {'os+g+p':>7} | {'ours(paper)':>11} {'':>6} {'':>7} | "
          f"{'DS est z2':>9} {'z3':>6} | {'dstk z1':>7} {'z2':>6} {'z3':>6}")
    worst = 0.0
    for nd in (4, 8, 16, 32, 64, 128, 256, 512, 1024):
        ours = [mem.zero_paper_bytes(params=PSI, dp=nd, stage=s) / 1e9 for s in (1, 2, 3)]
        nodes, per_node = (nd // 8, 8) if nd >= 8 else (1, nd)
        ds2 = estimate_zero2_model_states_mem_needs(PSI, num_gpus_per_node=per_node, num_nodes=nodes,
                                                    cpu_offload=False)[1] / 1e9
        ds3 = estimate_zero3_model_states_mem_needs(PSI, LARGEST_LAYER, num_gpus_per_node=per_node, num_nodes=nodes,
                                                    cpu_offload=False, cpu_offload_params=False)[1] / 1e9
        dstk = []
        for stage in (1, 2, 3):
            s = mem.model_states(params=PSI, persistent=0, precision="bf16", optimizer="adamw", zero_stage=stage, dp=nd)
            dstk.append((s.params_bytes + s.grads_bytes + s.step_grads_bytes + s.optimizer_bytes) / 1e9)
        paper = PAPER.get(nd)
        if paper:
            worst = max(worst, *(abs(o / p - 1) for o, p in zip(ours, paper)))
        shown = " ".join(f"{v:>{w}.2f}" for v, w in zip(paper, (8, 6, 7))) if paper else f"{'':>8} {'':>6} {'':>7}"
        print(f"{nd:>5} | {shown} | {ours[0]:>11.2f} {ours[1]:>6.2f} {ours[2]:>7.2f} | {ds2:>9.2f} {ds3:>6.2f} | "
              f"{dstk[0]:>7.2f} {dstk[1]:>6.2f} {dstk[2]:>6.2f}")
    print(f"largest difference between the paper's table and its formula: {worst:.1%} (the paper rounds)")


if __name__ == "__main__":
    main()
