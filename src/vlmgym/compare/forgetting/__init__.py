"""Forgetting studies (docs/forgetting.md): does teaching a generalist a new skill by RL forget less of its old skills
than teaching it by SFT, at the same gain on the new skill, and does the KL to the generalist predict what is
forgotten? settings (params.yaml), layout (dvc.yaml), stages (generalist, single-task SFT, sweep points, constant),
kl (the Monte Carlo KL), runs, figures, curves and report (report.md, .json, .png)."""
