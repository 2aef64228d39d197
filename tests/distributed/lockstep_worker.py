"""Run under torchrun by test_lockstep.py: two ranks share one stand-in engine group (engines/lockstep.py) and
report what each engine was asked.

torchrun --nproc-per-node 2 tests/distributed/lockstep_worker.py <out_dir>
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from tests.distributed.device import worker_env
from torchrl_post.distributed.env import end_process, init_world
from torchrl_post.engines.base import SamplingParams
from torchrl_post.engines.lockstep import Lockstep, agreed

PARAMS = SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=4, seed=0)


class Recorder:
    """A stepped engine that records its calls."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def add_request(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, uid: int, images: Any = None
    ) -> None:
        self.calls.append(["add", request_id, uid])

    def abort(self, request_ids: list[str]) -> None:
        self.calls.append(["abort", request_ids])

    def step(self) -> list[Any]:
        self.calls.append(["step"])
        return []


def main(out: Path) -> None:
    env = worker_env()
    init_world(env)
    group = dist.new_group([0, 1])
    report: dict[str, Any] = {}

    # Mirrored: both ranks run the same program.
    engine = Recorder()
    lock = Lockstep(engine, group)
    lock.add_request("a", [1], PARAMS, 7)
    lock.add_request("b", [2], PARAMS, 8)
    lock.step()
    lock.abort(["a"])
    lock.step()
    report["mirrored"] = engine.calls
    report["leader"] = lock.leader

    # Following: the leader's program alone, the other rank applies it.
    engine = Recorder()
    lock = Lockstep(engine, group, mirrored=False)
    if lock.leader:
        lock.add_request("c", [3], PARAMS, 9)
        lock.step()
        lock.abort(["c"])
        lock.add_request("d", [4], PARAMS, 10)
        lock.step()
        lock.finish()
        report["followed_steps"] = lock.steps
    else:
        report["followed_steps"] = lock.follow()
    report["followed"] = engine.calls

    # A decision made from timing: the leader's value everywhere.
    report["agreed"] = agreed(env.rank == 0, group)

    # Diverged: rank 1 adds another request; it fails at the step, naming the first difference.
    lock = Lockstep(Recorder(), group)
    lock.add_request("e" if env.rank == 0 else "f", [5], PARAMS, 11)
    try:
        lock.step()
        report["diverged"] = "no error"
    except RuntimeError as e:
        report["diverged"] = str(e)
    (out / f"rank{env.rank}.json").write_text(json.dumps(report))
    dist.barrier()
    end_process()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
