"""Evaluation for any env: its metrics with bootstrap intervals and paired differences, the HF baseline, and the
reports built from them (each env adds its own metrics and report section; vlmgym.envs.base)."""
