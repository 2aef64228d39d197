"""Whether bubblewrap is here, for the tests of torchrl_post/tools that run code in the sandbox."""

from __future__ import annotations

import pytest

from torchrl_post.tools.sandbox import SandboxUnavailable, bwrap_path

try:
    bwrap_path()
    HAVE_BWRAP = True
except SandboxUnavailable:
    HAVE_BWRAP = False
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap is not installed (make setup installs it)")
