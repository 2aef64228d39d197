"""Run under torchrun (1 process) by test_agent_loop.py: the agent loop on a real in-process vLLM engine.

    torchrun --nproc-per-node 1 tests/distributed/agent_worker.py <model_dir> <out.json>
    torchrun --nproc-per-node 2 tests/distributed/agent_worker.py <model_dir> <out.json> 2   # TP=2 lockstep

Checks token in, token out turn after turn, and that the trainer's logprobs of the trained tokens of the
multi-turn samples equal the engine's; writes what it measured and every trajectory's tokens (environments
inline: the engine's batches are the same run to run, so TP=1 and TP=2 runs can be compared).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer

from torchrl_post.agent.base import trajectories_to_batch
from torchrl_post.agent.chat import render
from torchrl_post.agent.guess_number import GuessAgent, GuessNumberEnv
from torchrl_post.agent.loop import AgentLoop, LoopLimits
from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import end_process, init_world, read_env
from torchrl_post.engines.base import SamplingParams
from torchrl_post.engines.build import build_engine
from torchrl_post.plan import engine_spec
from torchrl_post.workers.logprobs import batched_log_probs


def main() -> None:
    model_dir, out_path = sys.argv[1:3]
    tp = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    cfg = Config()
    cfg.rollout.tensor_parallel_size = tp
    cfg.model.path = model_dir
    cfg.data.max_prompt_length, cfg.data.max_response_length = 96, 32
    cfg.rollout.max_num_seqs = 64
    env = read_env("cpu")
    init_world(env)
    tok = AutoTokenizer.from_pretrained(model_dir)
    engine = build_engine(cfg.model, cfg.rollout, engine_spec(cfg), env.device, 0, tok.pad_token_id, [tok.eos_token_id])
    limits = LoopLimits(max_turns=3, max_response_length=24, max_model_len=128, timeout_s=120)
    group = dist.group.WORLD if tp > 1 else None
    loop = AgentLoop(engine, tok, GuessNumberEnv, GuessAgent(), limits, env_workers=0, group=group)
    params = SamplingParams(n=2, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=6, seed=5)
    tasks = [(i, {"answer": str(i % 10)}) for i in range(6)]
    trajs = loop.run(tasks if env.rank == 0 else [], params)  # the first rank's tasks are the ones run
    again = AgentLoop(engine, tok, GuessNumberEnv, GuessAgent(), limits, group=group).run(tasks, params)

    report: dict[str, object] = {"turns": [len(t.steps) for t in trajs], "terms": [t.termination for t in trajs]}
    report["responses"] = [[s.response_ids for s in t.steps] for t in trajs]
    report["engine_steps"] = loop.engine_steps
    if tp > 1:  # lockstep: every rank stepped as often and holds the same trajectories
        gathered: list[object] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (loop.engine_steps, report["responses"]))
        report["ranks_agree"] = all(g == gathered[0] for g in gathered)
        report["reproducible"] = report["responses"] == [[s.response_ids for s in t.steps] for t in again]
        if env.rank == 0:
            Path(out_path).write_text(json.dumps(report))
        engine.shutdown(process_ends=True)  # end_process follows
        end_process()
    report["reproducible"] = [[s.response_ids for s in t.steps] for t in trajs] == [
        [s.response_ids for s in t.steps] for t in again
    ]
    # Token in, token out: every turn's context is the previous context + its response + the observation delta.
    report["context_grows_by_delta"] = all(
        t.steps[k].prompt_ids
        == t.steps[k - 1].prompt_ids + t.steps[k - 1].response_ids + t.steps[k - 1].observation_ids
        for t in trajs
        for k in range(1, len(t.steps))
    )
    # The deltas are what the chat template renders for the whole conversation.
    rendered_ok = []
    for t in trajs:
        if len(t.steps) < 2:
            continue
        msgs = GuessAgent().initial_messages(t.task, GuessNumberEnv().reset(t.task))
        for s in t.steps[:-1]:  # a turn cut at its token budget has no end token: the delta supplies it
            ended = s.response_ids[-1:] == [tok.eos_token_id]
            msgs.append({"role": "assistant", "content": tok.decode(s.response_ids[:-1] if ended else s.response_ids)})
            msgs.append(
                {"role": "user", "content": tok.decode(s.observation_ids).split("user\n")[-1].split("<|im_end|>")[0]}
            )
        last = t.steps[-1].prompt_ids
        rendered_ok.append(tok.decode(last) == render(tok, msgs, True))
    report["rendered_checks"] = len(rendered_ok)
    report["rendered_equal"] = all(rendered_ok)
    # The trainer sees the engine's tokens: its logprobs of the trained tokens equal the engine's.
    batch = trajectories_to_batch(trajs, tok.pad_token_id)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logp = batched_log_probs(model, batch, 1.0, len(batch), torch.device("cpu"))
    m = batch.loss_mask.bool()
    report["max_logprob_diff"] = (logp - batch.rollout_log_probs)[m].abs().max().item()
    report["observation_tokens"] = int((batch.response_mask.bool() & ~m).sum())
    report["rows_equal_trajectories"] = all(
        batch.input_ids[i][batch.attention_mask[i].bool()].tolist() == t.prompt + t.response_tokens()[0]
        for i, t in enumerate(trajs)
    )
    # The hf engine runs the same loop (each step answers every queued turn as one batch).
    cfg.rollout.engine = "hf"
    hf = build_engine(cfg.model, cfg.rollout, engine_spec(cfg), env.device, 0, tok.pad_token_id, [tok.eos_token_id])
    hf_loop = AgentLoop(hf, tok, GuessNumberEnv, GuessAgent(), limits, turn_batches=True)
    hf_trajs = hf_loop.run(tasks, params)
    report["hf_turns"] = [len(t.steps) for t in hf_trajs]
    report["hf_engine_steps"] = hf_loop.engine_steps
    report["hf_context_grows_by_delta"] = all(
        t.steps[k].prompt_ids
        == t.steps[k - 1].prompt_ids + t.steps[k - 1].response_ids + t.steps[k - 1].observation_ids
        for t in hf_trajs
        for k in range(1, len(t.steps))
    )
    hf_batch = trajectories_to_batch(hf_trajs, tok.pad_token_id)
    with torch.no_grad():
        hf_logp = batched_log_probs(model, hf_batch, 1.0, len(hf_batch), torch.device("cpu"))
    hm = hf_batch.loss_mask.bool()
    report["hf_max_logprob_diff"] = (hf_logp - hf_batch.rollout_log_probs)[hm].abs().max().item()
    with open(out_path, "w") as f:
        json.dump(report, f)
    engine.shutdown(process_ends=True)  # end_process follows
    end_process()


if __name__ == "__main__":
    main()
