# source: https://github.com/huggingface/trl/blob/f2cd57710ae345ea6428ae95363267fcf38a3dc8/docs/source/clis.md
# lines: 60-63 of that file (the launch command as the file shows it)
# kept verbatim below; tests/unit/config/test_peer_scripts.py substitutes only paths and cluster sizes
trl grpo \
  --model_name_or_path Qwen/Qwen2.5-0.5B \
  --dataset_name HuggingFaceH4/Polaris-Dataset-53K \
  --reward_funcs accuracy_reward
