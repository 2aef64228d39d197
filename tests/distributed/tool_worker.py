"""Run under torchrun (1 process) by test_agent_loop.py: a tool call on Qwen's real tokenizer, end to end.

    torchrun --nproc-per-node 1 tests/distributed/tool_worker.py <tiny_qwen_model_dir> <work_dir> <out.json>

A tiny random Qwen2 over the real Qwen2.5 vocabulary is taught (a few seconds of supervised steps) one
conversation: call the calculator with a `<tool_call>` in hermes format, then answer with the tool's result.
The real vLLM engine then runs it through the agent loop with the calculator, the hermes parser and the
math environment; the worker records what the loop produced against what the chat template renders.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from torchrl_post.agent.base import trajectories_to_batch
from torchrl_post.agent.chat import observation_delta, prompt_ids, render
from torchrl_post.agent.loop import AgentLoop, LoopLimits
from torchrl_post.agent.math_agent import MathEnv, ToolAgent
from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import end_process, init_world, read_env
from torchrl_post.engines.base import SamplingParams
from torchrl_post.engines.build import build_engine
from torchrl_post.engines.vllm import tool_call_parser
from torchrl_post.plan import engine_spec
from torchrl_post.tools import ToolBox
from torchrl_post.workers.logprobs import batched_log_probs

QUESTION, A, B = "What is 12345+67890?", 12345, 67890
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12345+67890"}}\n</tool_call>'


def teach(model_dir: Path, out_dir: Path, tok: object, tools: list[dict]) -> list[int]:
    """Supervised steps on the one conversation until greedy decoding reproduces it; returns its ids."""
    t: object = tok
    first = prompt_ids(t, [{"role": "user", "content": QUESTION}], tools)
    call = t(CALL, add_special_tokens=False)["input_ids"] + [t.eos_token_id]  # type: ignore[operator, attr-defined]
    obs = observation_delta(t, [{"role": "tool", "content": str(A + B)}], True, tools)
    answer = t(str(A + B), add_special_tokens=False)["input_ids"] + [t.eos_token_id]  # type: ignore[operator, attr-defined]
    ids = first + call + obs + answer
    mask = [0] * len(first) + [1] * len(call) + [0] * len(obs) + [1] * len(answer)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # The fused Adam makes one pass over the 151k-row embedding a step instead of eight.
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, fused=True)
    x = torch.tensor([ids])
    where = torch.tensor(mask[1:]).nonzero().flatten()  # positions whose next token is trained
    targets = x[0, 1:][where]
    for step in range(400):
        hidden = model.model(input_ids=x).last_hidden_state[0, :-1][where]
        logits = model.lm_head(hidden)  # only where trained: the 151k-wide head dominates the cost
        loss = torch.nn.functional.cross_entropy(logits, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if bool((logits.argmax(-1) == targets).all()) and loss.item() < 0.05:  # with a margin
            print(f"taught in {step + 1} steps (loss {loss.item():.4f})", flush=True)
            break
    shutil.copytree(model_dir, out_dir, dirs_exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    return ids


def main() -> None:
    model_dir, work, out_path = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    env = read_env("cpu")
    init_world(env)
    tok = AutoTokenizer.from_pretrained(model_dir)
    box = ToolBox.from_specs(["calculator"])
    taught = work / "taught"
    expected = teach(model_dir, taught, tok, box.schemas())

    cfg = Config()
    cfg.model.path = str(taught)
    cfg.data.max_prompt_length, cfg.data.max_response_length = 320, 96
    cfg.agent.env = "torchrl_post.agent.math_agent:MathEnv"  # prefix caching as in training
    engine = build_engine(cfg.model, cfg.rollout, engine_spec(cfg), env.device, 0, tok.pad_token_id, [tok.eos_token_id])
    limits = LoopLimits(max_turns=3, max_response_length=96, max_model_len=416, timeout_s=120)
    loop = AgentLoop(engine, tok, MathEnv, ToolAgent(), limits, tools=box, parse_calls=tool_call_parser("hermes", tok))
    params = SamplingParams(n=1, temperature=0.0, top_p=1.0, top_k=-1, max_tokens=96, seed=0)
    (traj,) = loop.run([(0, {"question": QUESTION, "answer": str(A + B)})], params)
    ids, _, loss_mask = traj.response_tokens()
    report: dict[str, object] = {
        "turns": len(traj.steps),
        "termination": traj.termination,
        "reward": traj.reward,
        "tool_calls": sum(s.tool_calls for s in traj.steps),
        "tool_errors": sum(s.tool_errors for s in traj.steps),
        "first_response": tok.decode(traj.steps[0].response_ids) if traj.steps else "",
        "observation": tok.decode(traj.steps[0].observation_ids) if traj.steps else "",
        "tokens_equal_taught": traj.prompt + ids == expected,
        "observation_masked": len(traj.steps) > 1
        and loss_mask[len(traj.steps[0].response_ids) : len(traj.steps[0].response_ids) + 2] == [0.0, 0.0],
    }
    # What the chat template renders for the whole conversation (the assistant's call as the raw text the
    # model wrote, the tool result as a tool message) is exactly what the loop built from token deltas.
    if len(traj.steps) == 2:
        msgs = [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": CALL},
            {"role": "tool", "content": str(A + B)},
        ]
        rendered = tok(render(tok, msgs, True, box.schemas()), add_special_tokens=False)["input_ids"]
        report["context_equals_template"] = traj.steps[1].prompt_ids == rendered
    # The trainer sees exactly the engine's tokens: its logprobs of the trained tokens equal the engine's.
    batch = trajectories_to_batch([traj], tok.pad_token_id)
    model = AutoModelForCausalLM.from_pretrained(taught, dtype=torch.float32).eval()
    with torch.no_grad():
        logp = batched_log_probs(model, batch, 1.0, len(batch), torch.device("cpu"))
    trained = batch.loss_mask.bool()
    report["max_logprob_diff"] = (logp - batch.rollout_log_probs)[trained].abs().max().item()
    Path(out_path).write_text(json.dumps(report))
    engine.shutdown(process_ends=True)  # end_process follows
    end_process()


if __name__ == "__main__":
    main()
