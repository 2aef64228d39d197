"""A chat-completions server for the e2e tests' remote judge, and a reward server at /get_reward (OpenRLHF's protocol:
the response's digit fraction, as tests/e2e/rewards.py's, and reward/served 1). The judge it grades by reading the prompt the judge template
made (the response and reference answer fields of TEMPLATE) and replies with \\boxed{10} when they match, else \\boxed{0}; a
response `!` gets a reply without a score (a judge failure). Run: python tests/e2e/judge_server.py <port file>."""

from __future__ import annotations

import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TEMPLATE = "Question: {question} | Response: {response} | Reference: {ground_truth} | Grade 0-10 in \\boxed{}."


def digit_fraction(query: str, prompt: str) -> float:
    """tests/e2e/rewards.py's digit_fraction of the response in an OpenRLHF reward query (the prompt and the
    response with their special tokens): the query past the prompt, its <|...|> tokens dropped."""
    response = re.sub(r"<\|[^|]*\|>", "", query[len(prompt) :])
    return sum(c.isdigit() for c in response) / max(len(response), 1)


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/get_reward":  # a reward server, OpenRLHF's protocol (torchrl_post/reward/server.py)
            rewards = [digit_fraction(q, p) for q, p in zip(body["query"], body["prompts"], strict=True)]
            return self._send({"rewards": rewards, "extra_logs": {"served": [1.0] * len(rewards)}})
        prompt = body["messages"][-1]["content"]
        response = re.search(r"\| Response: (.*?) \| Reference", prompt, re.S)
        truth = re.search(r"\| Reference: (.*?) \| Grade", prompt, re.S)
        got = response.group(1).strip() if response else ""
        want = truth.group(1).strip() if truth else None
        text = "no idea" if got == "!" else ("\\boxed{10}" if got == want else "\\boxed{0}")
        self._send({"choices": [{"message": {"role": "assistant", "content": text}}]})

    def _send(self, data: object, code: int = 200) -> None:
        out = json.dumps(data).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Path(sys.argv[1]).write_text(str(server.server_address[1]))
    server.serve_forever()
