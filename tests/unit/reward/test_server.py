"""Tests of torchrl_post/reward/server.py against a real HTTP server in a thread: OpenRLHF's reward protocol, the
replies it takes, retries, and failures scored 0 and counted."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import pytest
import torch

from tests.e2e import judge_server
from torchrl_post.reward.server import RewardServer

SEEN: list[tuple[str, dict[str, Any]]] = []
FLAKY = {"left": 0}


class Handler(judge_server.Handler):  # its JSON replies
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        SEEN.append((self.path, body))
        responses = [q[len(p) :] for q, p in zip(body["query"], body["prompts"], strict=True)]
        if self.path == "/flaky" and FLAKY["left"] > 0:
            FLAKY["left"] -= 1
            return self._send({"error": "busy"}, 503)
        if self.path == "/short":
            return self._send({"rewards": [1.0]})
        if self.path == "/list":
            return self._send([float(r == lab) for r, lab in zip(responses, body["labels"], strict=True)])
        rewards = [float(r == lab) for r, lab in zip(responses, body["labels"], strict=True)]
        self._send({"rewards": rewards, "extra_logs": {"length": [len(r) for r in responses], "note": "x"}})


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _group(server: RewardServer) -> Any:
    prompts = ["<|im_start|>user\nSum 2 and 3.<|im_end|>\n<|im_start|>assistant\n"] * 3
    queries = [p + r for p, r in zip(prompts, ["5", "6", "55"], strict=True)]
    return server.score(queries, prompts, ["5", "5", "5"])


def test_a_group_is_one_request_in_openrlhfs_protocol_and_its_rewards_come_back(base: str) -> None:
    SEEN.clear()
    out = _group(RewardServer([f"{base}/a", f"{base}/b"]))
    assert out.scores.tolist() == [1.0, 0.0, 0.0] and out.errors == 0
    assert out.extra["length"].tolist() == [1.0, 1.0, 2.0] and "note" not in out.extra  # numeric lists of n only
    path, body = SEEN[0]
    assert path == "/a" and set(body) == {"query", "prompts", "labels"} and body["labels"] == ["5", "5", "5"]
    server = RewardServer([f"{base}/a", f"{base}/b"])
    for _ in range(3):
        _group(server)
    assert [p for p, _ in SEEN[1:]] == ["/a", "/b", "/a"]  # round-robin over the URLs
    assert _group(RewardServer([f"{base}/list"])).scores.tolist() == [1.0, 0.0, 0.0]  # a bare list


def test_a_busy_server_is_retried(base: str) -> None:
    FLAKY["left"] = 2
    server = RewardServer([f"{base}/flaky"], max_retries=3, backoff_s=0.01)
    out = _group(server)
    assert out.errors == 0 and server.retries == 2 and out.scores.tolist() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("path", ["/short", "/flaky", "/refused"])
def test_a_group_without_usable_rewards_scores_0_and_counts(base: str, path: str, caplog: Any) -> None:
    FLAKY["left"] = 5
    url = "http://127.0.0.1:9/get_reward" if path == "/refused" else f"{base}{path}"
    out = _group(RewardServer([url], timeout_s=2, max_retries=1, backoff_s=0.01))
    assert out.errors == 3 and torch.equal(out.failed, torch.ones(3)) and out.scores.sum() == 0
    assert "reward server" in caplog.text and "failed on a group of 3 (scored 0)" in caplog.text
