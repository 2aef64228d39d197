"""truncate_history: on resume, metrics.jsonl keeps rows through the resumed step only."""

import json

from torchrl_post.logging.metrics import truncate_history


def _row(step: int, **extra) -> str:
    return json.dumps({"training/global_step": step, **extra})


def _steps(path) -> list[int]:
    return [json.loads(line)["training/global_step"] for line in path.read_text().splitlines()]


def test_truncate_history_keeps_through_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(_row(s, loss=s / 10) + "\n" for s in range(6)))
    dropped = truncate_history(path, 3)
    assert dropped == 2
    assert _steps(path) == [0, 1, 2, 3]
    # the kept rows are unchanged, byte for byte
    assert path.read_text() == "".join(_row(s, loss=s / 10) + "\n" for s in range(4))


def test_truncate_history_drops_cut_short_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(_row(0) + "\n" + _row(1) + "\n" + _row(2) + "\n" + '{"training/global_step": 3, "actor/lo')
    dropped = truncate_history(path, 5)
    assert dropped == 1
    assert _steps(path) == [0, 1, 2]
    assert path.read_text().endswith("\n")


def test_truncate_history_drops_later_rows_and_cut_short_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(_row(0) + "\n" + _row(1) + "\n" + _row(2) + "\n" + _row(3) + "\n" + '{"training/glo')
    assert truncate_history(path, 1) == 3
    assert _steps(path) == [0, 1]


def test_truncate_history_row_without_step_counts_as_step_zero(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"val/test_score/arithmetic": 0.1}) + "\n" + _row(4) + "\n")
    assert truncate_history(path, 0) == 1
    assert path.read_text() == json.dumps({"val/test_score/arithmetic": 0.1}) + "\n"


def test_truncate_history_nothing_to_drop(tmp_path):
    path = tmp_path / "metrics.jsonl"
    text = _row(1) + "\n" + _row(2) + "\n"
    path.write_text(text)
    assert truncate_history(path, 2) == 0
    assert path.read_text() == text
    assert not (tmp_path / "metrics.tmp").exists()


def test_truncate_history_missing_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert truncate_history(path, 3) == 0
    assert not path.exists()
