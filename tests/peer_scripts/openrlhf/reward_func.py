# stands in for: https://github.com/OpenRLHF/OpenRLHF/blob/3c3be6234e0cb353e76bb8019947db9dfe99fca7/examples/python/reward_func.py
# not OpenRLHF's code: a reward function of the same name and signature (OpenRLHF's example returns random rewards),
# the file train_dapo_ray_hybrid_engine.sh's --reward.remote_url names
import torch


def reward_func(queries, prompts, labels, **kwargs):
    """1.0 where the query ends with its label, else 0.0, in OpenRLHF's dict of rewards, scores and extra logs."""
    reward = torch.tensor([float(q.strip().endswith(str(lab).strip())) for q, lab in zip(queries, labels, strict=True)])
    return {"rewards": reward, "scores": reward, "extra_logs": {"ends_with_label": reward}}
