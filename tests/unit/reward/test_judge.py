"""Tests of torchrl_post/reward/judge.py (template, score parser, config validation) and judge_client.py (RemoteJudge
against a real chat-completions server on 127.0.0.1)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.unit.error_helpers import _one_line
from torchrl_post.config.errors import ConfigError
from torchrl_post.reward.judge import DEFAULT_TEMPLATE, JudgeConfig, JudgeTemplate, parse_score, validate_judge
from torchrl_post.reward.judge_client import RemoteJudge

LABELS = {"correct": 1.0, "incorrect": 0.0}

# --- parse_score ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, parser, labels, scale, expected",
    [
        # number: the last number, signs and decimals, a hyphen between numbers is not a sign
        ("Score: 7", "number", None, None, 7.0),
        ("first 3, then 8.5.", "number", None, None, 8.5),
        ("worth -2 points", "number", None, None, -2.0),
        ("on a scale 0-10 I give 6", "number", None, None, 6.0),
        ("in the range 0-10", "number", None, None, 10.0),
        ("about .5", "number", None, None, 0.5),
        ("Qwen2 says nothing", "number", None, None, None),  # a digit inside a word is not a number
        ("\u5206\u65708", "number", None, None, 8.0),  # non-ASCII letters before it do not hide it
        ("7/10", "number", None, None, 10.0),  # literal: the last number (documented)
        ("no digits here", "number", None, None, None),
        ("", "number", None, None, None),
        (None, "number", None, None, None),
        ("1e999", "number", None, None, None),  # not finite
        # scale: linear to [0, 1], clamped
        ("Score: 8", "number", None, (0, 10), 0.8),
        ("Score: 12", "number", None, (0, 10), 1.0),
        ("Score: -3", "number", None, (0, 10), 0.0),
        ("Score: 3", "number", None, [1, 5], 0.5),
        # boxed: the last closed \boxed{}, nested braces, a number or a label
        (r"\boxed{3} no, \boxed{9}", "boxed", None, None, 9.0),
        (r"\boxed{\textbf{6}}", "boxed", None, (0, 10), 0.6),
        (r"\boxed{ 4.5 } and a dangling \boxed{7", "boxed", None, None, 4.5),
        (r"\boxed{\frac{1}{2}}", "boxed", None, None, None),  # two numbers: ambiguous
        (r"\boxed{}", "boxed", None, None, None),
        ("Score: 7", "boxed", None, None, None),  # no box: nothing, even with a number outside
        (r"\boxed{\text{Incorrect}}", "boxed", LABELS, None, 0.0),
        (r"\boxed{correct}", "boxed", LABELS, (0, 10), 1.0),  # a label's score is not scaled
        (r"\boxed {8}", "boxed", LABELS, (0, 10), 0.8),
        # label: whole words, any case, the last mentioned, longer labels first
        ("The response is INCORRECT.", "label", LABELS, None, 0.0),
        ("Correct? No: incorrect", "label", LABELS, None, 0.0),
        ("Looks incorrect at first, but it is correct", "label", LABELS, None, 1.0),
        ("incorrectly formatted but correct", "label", LABELS, None, 1.0),
        ("incorrectly formatted", "label", LABELS, None, None),
        ("not correct", "label", {"correct": 1.0, "not correct": 0.0}, None, 0.0),
        ("Correct but incomplete", "label", {"correct": 1.0, "correct but incomplete": 0.5}, None, 0.5),
        ("[[B]] beats [[A]]", "label", {"[[A]]": 1.0, "[[B]]": 0.0}, None, 1.0),
        ("nothing to see", "label", LABELS, None, None),
        ("correct", "label", None, None, None),
        # a reasoning judge's thoughts are dropped; cut off inside them, there is no score
        ("<think>maybe 3</think>Final: 9", "number", None, None, 9.0),
        ("<think>it is correct... or", "label", LABELS, None, None),
        (r"<think>\boxed{2}</think>", "boxed", None, None, None),
        ("the template opened it: 3 </think> so 7", "number", None, None, 7.0),
    ],
)
def test_parse_score(text, parser, labels, scale, expected):
    got = parse_score(text, parser, labels, scale)
    assert got == (pytest.approx(expected) if expected is not None else None)


# --- JudgeTemplate ----------------------------------------------------------------------------------------------


def test_template_fills_three_names_once_and_keeps_other_braces():
    template = JudgeTemplate(
        r'Q: {question} R: {response} T: {ground_truth} end with \boxed{} or {} or {"score": 1} {1}'
    )
    [user] = template.render("2+2?", "it is {ground_truth} {question}", 4)
    # a response holding a placeholder is not filled in again; literal braces survive
    assert user == {
        "role": "user",
        "content": r'Q: 2+2? R: it is {ground_truth} {question} T: 4 end with \boxed{} or {} or {"score": 1} {1}',
    }


def test_template_system_message_and_structured_inputs():
    template = JudgeTemplate("{question}|{response}|{ground_truth}", system="Be strict.")
    chat = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    messages = template.render(chat, "r", {"answer": [1, 2]})
    assert messages == [
        {"role": "system", "content": "Be strict."},
        {"role": "user", "content": 'system: sys\n\nuser: hi|r|{"answer": [1, 2]}'},
    ]
    assert template.render([{"role": "user", "content": "only"}], "r", None)[-1]["content"] == "only|r|"


def test_template_without_response_is_a_config_error():
    with pytest.raises(ConfigError) as exc:
        JudgeTemplate("Grade {question} against {ground_truth}")
    msg = _one_line(exc)
    assert "reward.judge.template" in msg and "no {response}" in msg and "add {response}" in msg


def test_template_unknown_placeholder_is_named_with_the_three():
    with pytest.raises(ConfigError) as exc:
        JudgeTemplate("{question} {response} {answer}")
    msg = _one_line(exc)
    assert "{answer}" in msg and "{question}, {response}, {ground_truth}" in msg and "reward.judge.template" in msg


def test_template_latex_arguments_are_not_placeholders():
    template = JudgeTemplate(r"{response}: grade in \boxed{score}, as \frac{a}{b}")
    assert template.render("q", "r", "t")[0]["content"] == r"r: grade in \boxed{score}, as \frac{a}{b}"


def test_template_load(tmp_path: Path):
    assert JudgeTemplate.load(None).text == DEFAULT_TEMPLATE
    assert JudgeTemplate.load("inline {response}").text == "inline {response}"
    for name in ("judge.txt", "judge.jinja"):
        (tmp_path / name).write_text("From a file: {response} vs {ground_truth}\n")
        assert JudgeTemplate.load(str(tmp_path / name)).render("q", "r", "t")[0]["content"] == "From a file: r vs t\n"
    with pytest.raises(ConfigError, match="no such file"):
        JudgeTemplate.load(str(tmp_path / "missing.txt"))
    (tmp_path / "bad.txt").write_text("{question}")
    with pytest.raises(ConfigError, match=r"reward.judge.template \(file .*bad.txt\) has no \{response\}"):
        JudgeTemplate.load(str(tmp_path / "bad.txt"))


def test_default_template_round_trip():
    """The shipped template renders every input and its reply format parses with the config's defaults."""
    cfg = JudgeConfig()
    content = JudgeTemplate.load(cfg.template).render("What is 2+2?", "It is 4.", "4")[0]["content"]
    assert "What is 2+2?" in content and "It is 4." in content and "\\boxed{}" in content
    assert parse_score("Matches. \\boxed{10}", cfg.parser, cfg.labels, cfg.scale) == 1.0


# --- validate_judge ---------------------------------------------------------------------------------------------


def _enabled(**kw: Any) -> JudgeConfig:
    return replace(JudgeConfig(enable=True, url="http://judge:8000/v1", model="judge-72b"), **kw)


def test_validate_judge_accepts_a_good_config_and_skips_a_disabled_one():
    validate_judge(_enabled())
    validate_judge(_enabled(url=None, parser="label", labels=LABELS, scale=None, on_error="skip_group"))
    validate_judge(JudgeConfig(enable=False, url="ftp://x", max_concurrency=0, on_error="oops"))


def test_validate_judge_one_line_per_problem():
    cfg = _enabled(
        template="{question} only",
        parser="label",
        on_error="ignore",
        url="judge:8000",
        max_concurrency=0,
        scale=[1.0, 1.0],
        timeout_s=0.0,
    )
    with pytest.raises(ConfigError) as exc:
        validate_judge(cfg)
    lines = str(exc.value).splitlines()
    assert len(lines) == 7, lines
    for key in ("template", "labels", "on_error='ignore'", "url='judge:8000'", "max_concurrency=0", "scale", "timeout"):
        assert sum(f"reward.judge.{key}" in line for line in lines) == 1, key


def test_validate_judge_api_key_variable(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("JUDGE_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="api_key_env='JUDGE_TEST_KEY'.*not set"):
        validate_judge(_enabled(api_key_env="JUDGE_TEST_KEY"))
    monkeypatch.setenv("JUDGE_TEST_KEY", "k")
    validate_judge(_enabled(api_key_env="JUDGE_TEST_KEY"))


# --- RemoteJudge against a real server --------------------------------------------------------------------------

Reply = Callable[[dict[str, Any], int], tuple[int, str, float]]  # (request body, request number) -> status, text, delay


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, reply: Reply) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.reply = reply
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    """Chat completions: 200 wraps the text as the assistant's message; any other status sends the text as it is."""

    server: _Server

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with server.lock:
            server.requests.append((dict(self.headers), body))
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
            number = len(server.requests)
        try:
            status, text, delay = server.reply(body, number)
            time.sleep(delay)
        finally:  # before the reply goes out: the client may send its next request as soon as it has it
            with server.lock:
                server.in_flight -= 1
        try:
            if status == 200:
                text = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]})
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(text.encode())))
            self.end_headers()
            self.wfile.write(text.encode())
        except OSError:  # the client gave up (timed out) and closed the connection
            pass

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """urllib would send 127.0.0.1 through a proxy set in the environment."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def serve() -> Iterator[Callable[[Reply], _Server]]:
    servers: list[_Server] = []

    def start(reply: Reply) -> _Server:
        server = _Server(reply)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _judge(url: str, **kw: Any) -> RemoteJudge:
    kw = {"parser": "boxed", "scale": (0, 10), "timeout_s": 2.0, "max_retries": 2, "backoff_s": 0.01, **kw}
    return RemoteJudge(url, "judge-model", JudgeTemplate("Q={question} R={response} T={ground_truth}"), **kw)


def _user(body: dict[str, Any]) -> str:
    return body["messages"][-1]["content"]


def test_remote_judge_scores_in_order(serve):
    # the "judge" gives 10 where the response equals the ground truth, else 2
    def grade(body, number):
        q, r, t = (part.split("=")[1] for part in _user(body).split(" "))
        return 200, f"Reasoning... \\boxed{{{10 if r == t else 2}}}", 0.0

    server = serve(grade)
    with _judge(server.base_url, temperature=0.7, max_tokens=64) as judge:
        out = judge.score(["a", "b", "c"], ["1", "5", "3"], [1, 2, 3])
    torch.testing.assert_close(out.scores, torch.tensor([1.0, 0.2, 1.0]))
    assert out.failed.tolist() == [False, False, False]
    assert (out.errors, out.parse_failures, out.retries) == (0, 0, 0)
    assert out.replies[1] == "Reasoning... \\boxed{2}" and out.latency_s > 0
    headers, body = server.requests[0]
    assert body["model"] == "judge-model" and body["temperature"] == 0.7 and body["max_tokens"] == 64
    assert "Authorization" not in headers  # no api_key_env: no key sent
    assert out.metrics()["reward/judge/errors"] == 0.0


def test_remote_judge_unparseable_reply_is_a_counted_failure(serve, caplog):
    server = serve(lambda body, n: (200, "I cannot decide." if "R=bad" in _user(body) else "\\boxed{5}", 0.0))
    with caplog.at_level(logging.WARNING), _judge(server.base_url) as judge:
        out = judge.score(["q", "q"], ["bad", "good"], ["t", "t"])
    assert out.failed.tolist() == [True, False]
    assert out.scores.tolist() == [0.0, 0.5]
    assert (out.errors, out.parse_failures) == (0, 1)
    assert "I cannot decide." in caplog.text


@pytest.mark.parametrize("status", [500, 503, 429])
def test_remote_judge_retries_5xx_and_429(serve, status):
    server = serve(lambda body, n: (status, "busy", 0.0) if n == 1 else (200, "\\boxed{7}", 0.0))
    with _judge(server.base_url) as judge:
        out = judge.score(["q"], ["r"], ["t"])
    assert out.retries == 1 and len(server.requests) == 2
    assert out.failed.tolist() == [False] and out.scores.tolist() == [pytest.approx(0.7)]
    assert (out.errors, out.first_error) == (0, None)


def test_remote_judge_does_not_retry_4xx_nor_malformed_replies(serve):
    # 201: a success status whose body is not chat-completions JSON
    server = serve(
        lambda body, n: (400, '{"error": "bad model"}', 0.0) if "R=a" in _user(body) else (201, "<html>", 0.0)
    )
    with _judge(server.base_url) as judge:
        out = judge.score(["q", "q"], ["a", "b"], ["t", "t"])
    assert out.failed.tolist() == [True, True] and out.retries == 0 and len(server.requests) == 2
    assert out.errors == 2 and out.parse_failures == 0
    assert "HTTP 400" in (out.first_error or "") and "bad model" in (out.first_error or "")


def test_remote_judge_timeout_is_a_bounded_failure(serve):
    server = serve(lambda body, n: (200, "\\boxed{9}", 1.0))
    start = time.monotonic()
    with _judge(server.base_url, timeout_s=0.3, max_retries=1) as judge:
        out = judge.score(["q"], ["r"], ["t"])
    assert time.monotonic() - start < 1.5  # two tries of 0.3 s, not the server's 1 s each
    assert out.failed.tolist() == [True] and out.errors == 1 and out.retries == 1
    assert "timed out" in (out.first_error or "") and "after 1 retries" in (out.first_error or "")


def test_remote_judge_connection_refused_is_a_failure():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with _judge(f"http://127.0.0.1:{port}/v1", max_retries=2) as judge:
        out = judge.score(["q", "q"], ["r", "r"], ["t", "t"])
    assert out.failed.tolist() == [True, True] and out.errors == 2 and out.retries == 4


def test_remote_judge_bounds_requests_in_flight(serve):
    server = serve(lambda body, n: (200, "\\boxed{10}", 0.15))
    with _judge(server.base_url, max_concurrency=2) as judge:
        out = judge.score(["q"] * 8, [str(i) for i in range(8)], ["t"] * 8)
    assert len(server.requests) == 8 and not out.failed.any()
    assert server.max_in_flight == 2  # concurrent, and never more than max_concurrency


def test_remote_judge_api_key_is_sent_and_never_shown(serve, caplog, monkeypatch: pytest.MonkeyPatch):
    key = "sk-test-5ecret-XYZ"
    monkeypatch.setenv("JUDGE_API_KEY", key)

    def reply(body, number):  # a 4xx that echoes the key back, and a reply that quotes it
        if "R=echo" in _user(body):
            return 401, f"invalid key {key} for this model", 0.0
        return 200, f"key {key}, no score", 0.0

    server = serve(reply)
    with caplog.at_level(logging.DEBUG), _judge(server.base_url, api_key_env="JUDGE_API_KEY") as judge:
        out = judge.score(["q", "q"], ["echo", "quote"], ["t", "t"])
        shown = [repr(judge), str(judge)]
    assert all(headers["Authorization"] == f"Bearer {key}" for headers, _ in server.requests)
    assert out.failed.tolist() == [True, True] and out.errors == 1 and out.parse_failures == 1
    assert "<redacted>" in (out.first_error or "") and "HTTP 401" in (out.first_error or "")
    shown += [caplog.text, repr(out), str(out), str(out.first_error), json.dumps(out.metrics())]
    assert all(key not in text for text in shown)

    monkeypatch.delenv("JUDGE_API_KEY")
    with pytest.raises(ConfigError) as exc:
        _judge(server.base_url, api_key_env="JUDGE_API_KEY")
    assert "JUDGE_API_KEY" in _one_line(exc) and "not set" in str(exc.value)


def test_remote_judge_from_config(monkeypatch: pytest.MonkeyPatch):
    cfg = _enabled(parser="label", labels=LABELS, scale=None, max_concurrency=3, timeout_s=5.0)
    with RemoteJudge.from_config(cfg) as judge:
        assert judge.url == "http://judge:8000/v1/chat/completions"
        assert (judge.parser, judge.labels, judge.scale, judge.timeout_s) == ("label", LABELS, None, 5.0)
        assert judge.template.text == DEFAULT_TEMPLATE
