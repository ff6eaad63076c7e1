"""vlmgym: a JAX gym for training vision-language models with GRPO."""

__version__ = "0.1.0"
