"""Values handed from one rank to another through the run's store, without a collective: for ranks of two roles
that each run their own loop (a rollout rank posts a group as it finishes; the reward model's first rank takes it
when it looks, and posts the scores back).

    box = Mailbox(store, "rm_scores")
    box.post("in/0/3", tensor)        # never waits
    box.take("in/0/3")                # the value and its key gone, or None while it is not there
    box.wait("out/0/3", "the reward model's scores of group 3")   # a clear error past the store's timeout

Values are tensors, numbers, strings and lists or dicts of them (`torch.save`, read back with weights_only).
"""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


def _bytes(value: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def _value(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)


class Mailbox:
    def __init__(self, store: dist.Store, name: str, timeout_s: float = 1800.0) -> None:
        """`timeout_s`: how long `wait` waits (the plan's collective deadline: the peer beats but never posts)."""
        self.store, self.timeout_s = dist.PrefixStore(f"mailbox_{name}/", store), timeout_s

    def post(self, key: str, value: Any) -> None:
        self.store.set(key, _bytes(value))  # type: ignore[arg-type]  # the binding takes bytes; the stub says str

    def take(self, key: str) -> Any:
        """The value at `key`, removed; None while nothing was posted there."""
        if not self.store.check([key]):
            return None
        value = _value(self.store.get(key))
        self.store.delete_key(key)
        return value

    def wait(self, key: str, what: str) -> Any:
        """The value at `key` once posted, removed; past the timeout, an error that says what did not come."""
        try:
            self.store.wait([key], timedelta(seconds=self.timeout_s))
        except (RuntimeError, dist.DistStoreError) as e:
            raise RuntimeError(f"{what} did not come within {self.timeout_s:g} s: {e}") from e
        return self.take(key)
