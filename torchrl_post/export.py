"""Export a checkpoint's policy as an HF model directory (safetensors, config, tokenizer).

python -m torchrl_post.export outputs/demo/checkpoints/global_step_300 outputs/demo/hf_step_300
python -m torchrl_post.export outputs/lora/checkpoints/global_step_300 outputs/lora/adapter          # PEFT adapter
python -m torchrl_post.export outputs/lora/checkpoints/global_step_300 outputs/lora/merged --merge  # merged model
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from torchrl_post.checkpoint.hf import export_checkpoint
from torchrl_post.config.errors import UserError


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint_dir", type=Path, help="a checkpoints/global_step_N directory")
    ap.add_argument("out_dir", type=Path, help="where to write the HF model")
    ap.add_argument("--merge", action="store_true", help="LoRA checkpoints: write the merged model, not the adapter")
    args = ap.parse_args()
    try:
        out = export_checkpoint(args.checkpoint_dir, args.out_dir, args.merge)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"exported {args.checkpoint_dir} -> {out}")


if __name__ == "__main__":
    main()
