"""Run under torchrun by test_disaggregated.py: prompt groups move from rollout ranks to actor ranks.

    torchrun --nproc-per-node 3|4 tests/distributed/transfer_worker.py <out_dir>

Actor ranks [0, 1], rollout ranks [2] or [2, 3]. Every rollout rank fabricates its share of 12 groups of
4 samples with lengths that differ per sample and tokens that encode (group, sample, position); the real
topology (one torch world per cell, the cross-cell gloo group) moves them with the trainer's calls. Each
rank writes what it received for the test to check.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from tests.distributed.checks import actor_rollout_topology
from torchrl_post.distributed.env import end_process, read_env
from torchrl_post.distributed.transfer import all_gather_rows, plan_transfer, route

GROUPS, N = 12, 4


def sample(g: int, k: int) -> list[int]:
    length = 1 + (g * 7 + k * 3) % 11
    return [g * 1000 + k * 100 + j for j in range(length)]


def main() -> None:
    out = Path(sys.argv[1])
    env = read_env("cpu")
    rollout = list(range(2, env.world_size))
    topo = actor_rollout_topology(env)
    assert topo.world is not None
    per = GROUPS // len(rollout)
    items, rows = {}, []
    if env.rank in rollout:
        e = rollout.index(env.rank)
        for g in range(e * per, (e + 1) * per):
            ids = [sample(g, k) for k in range(N)]
            items[g] = (ids, [[-0.5] * len(s) for s in ids], ["stop"] * N)
            rows.append([g, env.rank, sum(len(s) for s in ids), 0, 0])
    table = all_gather_rows(topo.world, torch.tensor(rows, dtype=torch.int64).view(-1, 5), per)
    owner, dest = plan_transfer(table, GROUPS, [0, 1])
    got = route(topo.world, items, owner, dest)
    record = {
        "rank": env.rank,
        "groups": {str(g): ids for g, (ids, _, _) in got.items()},
        "tokens": sum(sum(len(s) for s in ids) for ids, _, _ in got.values()),
        "max_group_tokens": int(table[:, 2].max()),
    }
    (out / f"rank_{env.rank}.json").write_text(json.dumps(record))
    topo.world.barrier().wait()
    end_process()


if __name__ == "__main__":
    main()
