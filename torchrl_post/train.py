"""Entrypoint: config -> run plan -> process groups -> this rank's program -> fit.

    torchrun --standalone --nproc-per-node 2 -m torchrl_post.train [--config-path DIR] [--config-name NAME] [key=value ...]
    torchrun --standalone --nproc-per-node 2 -m torchrl_post.train --learning_rate 1e-6 --num_generations 8  # TRL's
    torchrun --standalone --nproc-per-node 2 $(which torchrl-post-train) ...   # the console script
    python -m torchrl_post.train trainer.dry_run=true        # print the plan, load nothing

User errors (config, data, paths) end the run with one line on stderr and exit code 2. A script passes Python
objects where these arguments name import paths and files: the same run through `torchrl_post.api` (api.py).
"""

from __future__ import annotations

import sys

from torchrl_post import api
from torchrl_post.config import UserError
from torchrl_post.config.load import load_command_line
from torchrl_post.distributed.env import end_process


def main(argv: list[str] | None = None) -> None:
    """The command line as a client of the Python API: the config from the arguments, then `api.run`, which
    resolves the config's import paths into the objects a script would pass."""
    code = 0
    alias_notes: list[str] = []  # verl / ROLL / rLLM / TRL names on the command line, one note each
    try:
        cfg = load_command_line(sys.argv[1:] if argv is None else argv, alias_notes)
        api.run(cfg, notes=alias_notes, process_ends=True)
    except UserError as e:
        api.report_error(e)  # a no-op for what api.run reported already
        code = 2
    end_process(code)


if __name__ == "__main__":
    main()
