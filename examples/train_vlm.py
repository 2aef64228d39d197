"""GRPO on a tiny vision-language model (the seed's train_vlm.py): name the colour of the shape in the image. The
rows carry their images in memory (PIL), and the reward function is handed to `train` with them.

    make vlm-model             # outputs/vlm_model_qwen2_vl: a tiny Qwen2-VL answering with a random colour word
    torchrun --standalone --nproc-per-node 2 examples/train_vlm.py [key=value ...]

The config is configs/vlm.yaml under the command line's overrides (model.path=outputs/vlm_model_qwen3_vl for
`make vlm-model VLM_ARCH=qwen3_vl`). A model blind to the image scores 0.25; RL has to teach it to look.
"""

import sys

from torchrl_post.api import config, train
from torchrl_post.demo.vlm_task import colour_reward, make_vlm_rows


def main() -> None:
    cfg = config(sys.argv[1:], name="vlm")
    train_rows, val_rows = make_vlm_rows(seed=0)  # {"prompt": "<image>What colour is it?", "images": [PIL], ...}
    train(cfg, reward_fn=colour_reward, train_data=train_rows, val_data=val_rows)


if __name__ == "__main__":
    main()
