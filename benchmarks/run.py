"""The weight-sync benchmark's old entry point, kept as an alias: `python -m benchmarks.run` is
`python -m benchmarks.sync` (the suite: `python -m benchmarks`, see benchmarks/__main__.py)."""

from __future__ import annotations

from benchmarks.sync import main

if __name__ == "__main__":
    main()
