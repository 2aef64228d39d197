"""Build hook: the shipped Hydra YAML lives at the repository root (`configs/`) and goes into the wheel as
`torchrl_post/configs/`. Everything else about the package is in pyproject.toml.

An editable install (`pip install -e .`, as the Makefile does) copies nothing: there
torchrl_post.config.shipped.default_config_dir reads `configs/` from the checkout.
"""

from __future__ import annotations

import glob
import os

from setuptools import setup
from setuptools.command.build_py import build_py

CONFIGS_SRC = "configs"  # relative to the project root, where setuptools runs this file
CONFIGS_PKG = os.path.join("torchrl_post", "configs")


class BuildPyWithConfigs(build_py):
    """build_py that also copies configs/*.yaml into build_lib/torchrl_post/configs/."""

    def _config_files(self) -> list[tuple[str, str]]:
        sources = sorted(glob.glob(os.path.join(CONFIGS_SRC, "*.yaml")))
        if not sources:
            raise RuntimeError(f"no YAML configs in {os.path.abspath(CONFIGS_SRC)}; the wheel would ship without them")
        target = os.path.join(self.build_lib, CONFIGS_PKG)
        return [(src, os.path.join(target, os.path.basename(src))) for src in sources]

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        for src, dst in self._config_files():
            self.mkpath(os.path.dirname(dst))
            self.copy_file(src, dst)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if self.editable_mode:
            return outputs
        return [*outputs, *(dst for _, dst in self._config_files())]


setup(cmdclass={"build_py": BuildPyWithConfigs})
