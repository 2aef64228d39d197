"""A chat-completions server for the e2e tests' remote judge: it grades by reading the prompt the judge template
made (the response and reference answer fields of TEMPLATE) and replies with \\boxed{10} when they match, else \\boxed{0}; a
response `!` gets a reply without a score (a judge failure). Run: python tests/e2e/judge_server.py <port file>."""

from __future__ import annotations

import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TEMPLATE = "Question: {question} | Response: {response} | Reference: {ground_truth} | Grade 0-10 in \\boxed{}."


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        response = re.search(r"\| Response: (.*?) \| Reference", prompt, re.S)
        truth = re.search(r"\| Reference: (.*?) \| Grade", prompt, re.S)
        got = response.group(1).strip() if response else ""
        want = truth.group(1).strip() if truth else None
        text = "no idea" if got == "!" else ("\\boxed{10}" if got == want else "\\boxed{0}")
        out = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
        self.send_response(200)
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
