"""GRPO with a LoRA adapter on the demo model (the seed's train_with_lora.py): only the adapter trains, and the
engine samples the adapted model (merged weights at every sync). The reward function and the datasets are
Python objects handed to `train`: the rows as `datasets.Dataset`s, as rLLM's scripts hold them.

    make demo                  # outputs/demo_model: a tiny Qwen2 warm-started on single-digit sums
    torchrun --standalone --nproc-per-node 2 examples/train_with_lora.py [key=value ...]

The config is configs/lora.yaml (model.lora_rank=8, lora_alpha=16, actor.lr=2e-3) under the command line's
overrides.
"""

import sys

from datasets import Dataset

from torchrl_post.api import config, train
from torchrl_post.demo.task import make_rows
from torchrl_post.reward.builtin import arithmetic


def main() -> None:
    cfg = config(sys.argv[1:], name="lora")
    train_rows, val_rows = make_rows(seed=0)  # "What is 3+4?" -> "7", in five phrasings
    train(cfg, reward_fn=arithmetic, train_data=Dataset.from_list(train_rows), val_data=Dataset.from_list(val_rows))


if __name__ == "__main__":
    main()
