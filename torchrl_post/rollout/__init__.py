"""Rollout: engines (engines.py, base.py), the rollout source (source.py) and rollout ranks (remote.py)."""
