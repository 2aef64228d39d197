"""Reward functions imported by path in reward/test_scoring.py (`tests.unit.reward_helpers:<name>`)."""

CALLS: list[tuple] = []


def length_reward(data_source, solution_str, ground_truth, extra_info=None):
    CALLS.append((data_source, solution_str, ground_truth, extra_info))
    return float(len(solution_str))


NOT_A_FUNCTION = 3
