"""Run under torchrun by test_inflight.py: a weight update lands in the middle of generation (rollout/inflight.py).

The real vLLM engine generates 4 requests at temperature 1; after a few engine steps it gets new weights (the
model plus noise) and continues. Then the HF model recomputes each finished sample's logprobs under the old and
the new weights: tokens of version 0 must carry the old policy's logprobs, tokens of version 1 the new one's
(exactly when the update recomputes the context; with the KV cache kept, the first tokens after it attend to
old-weight keys and values, which the report measures). Prefix caching is on (block 32) and two prompts span a
block: a request added after the update (keep mode: a group's next sample, while the others still run) must not
read the blocks the old weights computed for the same prompt.

torchrun --nproc-per-node 1 tests/distributed/inflight_worker.py <model_dir> <out.json>
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import end_process, init_world, read_env
from torchrl_post.engines.base import SamplingParams
from torchrl_post.engines.build import build_engine
from torchrl_post.plan import engine_spec
from torchrl_post.rollout.inflight import InflightSample, InflightStream

UPDATE_AT = 5  # engine steps before the new weights arrive
MAX_TOKENS = 16


@torch.no_grad()
def recomputed(model: torch.nn.Module, s: InflightSample) -> list[float]:
    """The model's logprob of each of the sample's tokens given the prompt and the tokens before it."""
    ids = torch.tensor([s.prompt_ids + s.tokens])
    logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(s.tokens).unsqueeze(-1)).squeeze(-1).tolist()


def main() -> None:
    model_dir, out_path = sys.argv[1:3]
    cfg = Config()
    cfg.model.path = model_dir
    cfg.data.max_prompt_length, cfg.data.max_response_length = 64, MAX_TOKENS
    env = read_env("cpu")
    init_world(env)
    old = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    new = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05 * p.abs().mean())
    # Two prompts of more than one 32-token block: with prefix caching on, a request re-added after the update
    # (recompute) would read the blocks the old weights computed, unless the engine keeps them apart.
    prompts = [torch.randint(5, 100, (n,), generator=gen).tolist() for n in (5, 9, 40, 50)]
    params = SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=MAX_TOKENS, seed=1)
    spec = replace(engine_spec(cfg, first_sync=True), prefix_caching=True)  # as agent runs have it
    engine = build_engine(cfg.model, cfg.rollout, spec, env.device, 0, 0, [3])
    report: dict[str, Any] = {}
    for mode in ("keep", "recompute"):
        engine.load_weights(old.named_parameters())  # version 0 (the engine starts from dummy weights)
        stream = InflightStream(engine, recompute=mode == "recompute")  # type: ignore[arg-type]
        for i, p in enumerate(prompts):
            stream.add(f"{mode}-{i}", p, params, uid=i)

        def at_step(s: InflightStream, mode: str = mode) -> None:
            if s.engine_steps == UPDATE_AT:
                s.update(new.named_parameters(), version=1)
            if s.engine_steps == UPDATE_AT + 1 and mode == "keep":  # a group's next sample, after the update
                s.add(f"{mode}-late", prompts[3], params, uid=3)

        start = time.perf_counter()
        done = stream.run(at_step)
        seconds = time.perf_counter() - start
        samples, late = [], []
        for s in sorted(done, key=lambda x: x.request_id):
            lp_old, lp_new = recomputed(old, s), recomputed(new, s)
            (late if s.request_id.endswith("late") else samples).append(
                {
                    "versions": s.versions,
                    "tokens": len(s.tokens),
                    "restarts": s.restarts,
                    "finish": s.finish_reason,
                    "diff_old": [abs(a - b) for a, b, v in zip(s.logprobs, lp_old, s.versions, strict=True) if v == 0],
                    "diff_new": [abs(a - b) for a, b, v in zip(s.logprobs, lp_new, s.versions, strict=True) if v == 1],
                    "new_vs_old": [abs(a - b) for a, b, v in zip(lp_new, lp_old, s.versions, strict=True) if v == 1],
                }
            )
        report[mode] = {"samples": samples, "late": late, "seconds": seconds, "engine_steps": stream.engine_steps}
    with open(out_path, "w") as f:
        json.dump(report, f)
    engine.shutdown(process_ends=True)  # end_process follows
    end_process()


if __name__ == "__main__":
    main()
