"""Run under torchrun by test_sync_parity.py: a weight broadcast to a slow receiver, in buckets of uneven sizes,
whose whole length is longer than the groups' timeout (the TRL #7103 and prime-rl #3599 patterns).

    torchrun --nproc-per-node 3 tests/distributed/slow_sync_worker.py <model_dir> <out_dir>

Actor ranks [0, 1] (FSDP2) gather every bucket; rank 0 broadcasts each to the rollout rank 2, which takes
SLOW_S per tensor (an engine slow to load). Then rank 1 goes straight into a collective of the actor's own group,
which rank 0 joins only once its last broadcasts are done. With the groups' timeout lowered to TIMEOUT_S, nothing
may time out: every wait is bounded by a bucket or two of the transfer, never by the whole of it. Each rank
writes what it saw to <out_dir>/rank<r>.json: its seconds, and the float64 sum of every tensor (the actor's full
parameters, the receiver's received ones) for an exact comparison.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from tests.distributed.checks import actor_rollout_topology, make_actor
from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import end_process, read_env
from torchrl_post.sync.weights import BroadcastSync

TIMEOUT_S = 4
SLOW_S = 0.25
BUCKET_BYTES = 16 << 10  # the tiny model's tensors are 0.25 to 32 KiB: buckets of one to several, uneven


def main() -> None:
    model_dir, out_dir = sys.argv[1], Path(sys.argv[2])
    cfg = Config()
    cfg.model.path = model_dir
    env = read_env("cpu")
    topo = actor_rollout_topology(env)
    assert topo.world is not None
    actor = make_actor(cfg, topo.mesh("actor")) if env.rank in (0, 1) else None
    sync = BroadcastSync(topo.sync, env.device, BUCKET_BYTES, torch.float32, actor.model if actor else None)
    topo.world.barrier().wait()  # everything built: from here the short timeout
    timeout = timedelta(seconds=TIMEOUT_S)
    dist.distributed_c10d._set_pg_timeout(timeout)  # this rank's cell: the actor's FSDP group on ranks 0, 1
    if topo.sync is not None:
        topo.sync._set_default_timeout(timeout)
    report: dict[str, object] = {"buckets": [b.nbytes for b in sync.buckets]}
    start = time.monotonic()
    if actor is not None:
        sync.send(actor.model)
        report["send_s"] = time.monotonic() - start
        t = time.monotonic()
        dist.all_reduce(torch.ones(1))  # rank 1 here while rank 0 may still be broadcasting
        report["next_collective_waited_s"] = time.monotonic() - t
        full = {n: p.full_tensor() if isinstance(p, DTensor) else p for n, p in actor.model.named_parameters()}
        report["sums"] = {n: t.double().sum().item() for n, t in full.items()}
    else:
        sums = {}
        for name, t in sync.received():
            time.sleep(SLOW_S)
            sums[name] = t.double().sum().item()
        report["sums"], report["receive_s"] = sums, time.monotonic() - start
    report["timeout_s"] = TIMEOUT_S
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{env.rank}.json").write_text(json.dumps(report))
    end_process()


if __name__ == "__main__":
    main()
