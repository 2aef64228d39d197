"""Tensors shared by the tests of torchrl_post/algos."""

import torch

# Two rows: 3 real tokens and 1 real token, width 4 (right padding).
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
