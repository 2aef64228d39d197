"""The documentation site (mkdocs.yml over docs/) builds in strict mode: a broken link, a missing page or a page
left out of the nav fails, as `make docs` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_docs_site_builds_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page in ("index", "getting-started/index", "config/index", "memory/index", "gpu/index", "benchmarks/index"):
        assert (tmp_path / "site" / f"{page}.html").stat().st_size > 0, page


def test_readme_links_point_at_pages_that_exist() -> None:
    import re

    text = (REPO / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert len(links) > 10
    missing = [link for link in links if not (REPO / link).is_file()]
    assert not missing, missing
    assert len(text.splitlines()) <= 200
