"""`vlmgym plan`: per-device memory of a training step for a real config, without its weights (see cli.py)."""
