"""Comparative studies as DVC pipelines (docs/studies.md): `vlmgym study` (study: a study's folder, settings and
dvc.yaml in layout and settings, its stages in stages and report, the report's tables in tables), the arms trained
from one SFT start per seed (arms) and the results over seeds (seeds); `vlmgym compare` writes a study and runs it
(command)."""
