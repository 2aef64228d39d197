"""A math agent with a calculator (the seed's train_math_agent.py, on this project's tiny model): the environment
and agent classes, the tool and the datasets are Python objects handed to `train`.

    make math-agent-model      # outputs/math_agent_model: a tiny Qwen2 warm-started on the tool-call format
    torchrun --standalone --nproc-per-node 2 examples/train_math_agent.py [key=value ...]

The config is configs/math_agent.yaml under the command line's overrides. The task: sums of two 3-digit numbers,
which the tiny model cannot add in its head but can hand to the calculator; reward 1 for the exact sum.
"""

import sys

from torchrl_post.agent.math_agent import MathEnv, ToolAgent
from torchrl_post.api import config, train
from torchrl_post.demo.math_agent import make_math_rows
from torchrl_post.tools.builtin import calculator


def main() -> None:
    cfg = config(sys.argv[1:], name="math_agent")
    train_rows, val_rows = make_math_rows(seed=0)  # {"prompt", "answer", "data_source", "question"} rows
    train(
        cfg,
        env_cls=MathEnv,
        agent_cls=ToolAgent,
        tools=[calculator],
        train_data=train_rows,
        val_data=val_rows,
    )


if __name__ == "__main__":
    main()
