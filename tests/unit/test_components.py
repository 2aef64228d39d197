"""Tests of torchrl_post/components.py: objects passed in Python and import paths give the same components, and
they reach the places the import paths reached (the run's set-up, the agent loop)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from torchrl_post.agent.math_agent import MathEnv, ToolAgent
from torchrl_post.build import build_agent_loop
from torchrl_post.components import Components, Given, label, label_config, resolve_components
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.schema import Config
from torchrl_post.demo.tokenizer import build_char_tokenizer
from torchrl_post.reward.builtin import arithmetic
from torchrl_post.tools.builtin import calculator

ROWS = [{"prompt": "What is 1+2?", "answer": "3"}, {"prompt": "4+5=?", "answer": "9"}]


def my_reward(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    return float(solution_str == ground_truth)


def search(query: str) -> str:
    """Look something up."""
    return query


class ScaledEnv(MathEnv):
    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale


class PromptedAgent(ToolAgent):
    def __init__(self, system: str = "") -> None:
        self.system = system


def _cfg(**agent: Any) -> Config:
    cfg = Config()
    for key, value in agent.items():
        setattr(cfg.agent, key, value)
    return cfg


def test_import_paths_resolve_to_the_objects() -> None:
    """The command line's keys: the classes and built-in tools they name; agent episodes import no reward."""
    cfg = _cfg(
        env="torchrl_post.agent.math_agent:MathEnv",
        agent="torchrl_post.agent.math_agent:ToolAgent",
        tools=["calculator"],
    )
    cfg.reward.function = "torchrl_post.no_such_module:f"  # ignored (noted by the plan), never imported
    parts = resolve_components(cfg)
    assert parts.agent is not None and parts.reward_fn is None
    assert parts.agent.make_env is MathEnv and isinstance(parts.agent.make_agent(), ToolAgent)
    assert parts.agent.tools is not None and parts.agent.tools.tools == {"calculator": calculator}
    single = Config()
    single.reward.function = "torchrl_post.reward.builtin:arithmetic"
    assert resolve_components(single) == Components(reward_fn=arithmetic)
    assert resolve_components(Config()) == Components()  # built-in rewards by data_source, data from files


def test_objects_replace_the_keys_that_name_them() -> None:
    cfg = _cfg(tools=["python"])
    cfg.data.train_files = "mine/train.jsonl"  # set by a YAML or an override: noted when it gives way
    given = Given(
        reward_fn=my_reward,
        train_data=ROWS,
        val_data=ROWS[:1],
        env_cls=ScaledEnv,
        env_args={"scale": 2.0},
        agent_cls=PromptedAgent,
        agent_args={"system": "be brief"},
        tools=[calculator, search, "python"],
    )
    notes = label_config(cfg, given)
    assert cfg.agent.env == f"{__name__}:ScaledEnv" and cfg.agent.agent == f"{__name__}:PromptedAgent"
    assert cfg.reward.function == f"{__name__}:my_reward" == label(my_reward)
    assert cfg.agent.tools == ["calculator", "search", "python"]
    assert (cfg.data.train_files, cfg.data.val_files) == ("<train_data: 2 rows>", "<val_data: 1 rows>")
    assert notes == [
        "agent.tools=['python'] gives way to the tools passed in Python",
        "data.train_files='mine/train.jsonl' gives way to the train_data passed in Python",
    ]
    parts = resolve_components(cfg, given)
    assert parts.agent is not None and parts.train_data is ROWS and parts.val_data == ROWS[:1]
    env, agent = parts.agent.make_env(), parts.agent.make_agent()
    assert isinstance(env, ScaledEnv) and env.scale == 2.0 and parts.agent.make_env() is not env  # one per trajectory
    assert isinstance(agent, PromptedAgent) and agent.system == "be brief"
    assert parts.agent.tools is not None and list(parts.agent.tools.tools) == ["calculator", "search", "python"]
    assert parts.agent.tools.schemas()[1]["function"]["description"] == "Look something up."
    assert parts.reward_fn is None  # agent episodes are scored by their environment
    single = Config()
    assert resolve_components(single, Given(reward_fn=my_reward)).reward_fn is my_reward
    boxed = resolve_components(_cfg(env="a:B", agent="a:C"), Given(env_cls=MathEnv, agent_cls=ToolAgent, tools={}))
    assert boxed.agent is not None and boxed.agent.tools is None  # no tools: no tool parser


def test_objects_reach_the_agent_loop(parse: Any) -> None:
    """build_agent_loop takes the resolved parts where it took import paths."""
    cfg = _cfg(env="x:Y", agent="x:Z")
    parts = resolve_components(cfg, Given(env_cls=ScaledEnv, agent_cls=PromptedAgent, tools={"add": calculator}))
    assert parts.agent is not None
    loop = build_agent_loop(cfg.agent, parts.agent, 48, 112, None, build_char_tokenizer())
    assert loop.make_env is parts.agent.make_env and isinstance(loop.agent, PromptedAgent)
    assert loop.tools is parts.agent.tools and loop.parse_calls is not None
    assert [s["function"]["name"] for s in loop.tool_schemas or []] == ["add"]


@pytest.mark.parametrize(
    ("given", "cfg", "needle"),
    [
        (Given(reward_fn="pkg:f"), Config(), "reward_fn='pkg:f' is a str; pass the function or class itself"),
        (Given(env_args={"a": 1}), Config(), "env_args was given without an environment"),
        (Given(agent_cls=ToolAgent, agent_args=[1]), Config(), "agent_args=[1] must be a dict"),
        (Given(tools="calculator"), Config(), "must be a list of tools, not one string"),
        (Given(tools=[calculator, calculator]), Config(), "tools[1]: a second tool named 'calculator'"),
        (Given(tools=["nope"]), Config(), "tools[0]: tool 'nope' is neither a built-in"),
    ],
)
def test_bad_objects_are_one_line(given: Given, cfg: Config, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        label_config(cfg, given)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_reward_that_cannot_take_verls_arguments() -> None:
    with pytest.raises(ConfigError, match=r"reward_fn='.*<lambda>': signature \(x\) cannot take verl's four"):
        resolve_components(Config(), Given(reward_fn=lambda x: 0.0))


def test_rows_and_objects_reach_the_runs_set_up(tiny_model: Path, tmp_path: Path) -> None:
    """Run.prepare parses the rows held in memory (not data.train_files), scores with the given reward for every
    data source, and keeps the agent parts for the builders."""
    from torchrl_post.plan import plan_run
    from torchrl_post.run import Run

    cfg = Config()
    cfg.model.path = str(tiny_model)
    cfg.trainer.default_local_dir = str(tmp_path / "run")
    cfg.data.train_batch_size = 2
    given = Given(reward_fn=my_reward, train_data=ROWS, val_data=[{**ROWS[0], "data_source": "mine"}])
    label_config(cfg, given)
    run = Run.prepare(cfg, plan_run(cfg, 1), None, None, resolve_components(cfg, given))  # type: ignore[arg-type]
    assert len(run.train_data) == 2 and run.train_data.answers == ["3", "9"] and run.train_data.files == []
    assert run.val_data is not None and run.val_data.data_sources == ["mine"]
    assert run.reward_fn_for("mine") is my_reward and run.reward_fn_for("arithmetic") is my_reward
    assert run.components.agent is None
