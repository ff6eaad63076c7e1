"""Which split a stage trains on: the train stage samples the rl split where the shard stage held one out
(`shard.rl_samples`), every other stage and every run without it read train."""

from __future__ import annotations

from vlmgym import envs
from vlmgym.params import EnvParams
from vlmgym.rl.stage_setup import prompt_split


def test_the_train_stage_samples_the_rl_split_where_it_exists(tmp_path):
    single = EnvParams()
    (tmp_path / "train").mkdir()
    assert prompt_split("train", str(tmp_path), single) == "train"
    (tmp_path / "rl").mkdir()
    assert prompt_split("train", str(tmp_path), single) == "rl"
    assert prompt_split("sft", str(tmp_path), single) == "train"  # SFT never reads the held-out prompts


def test_a_mixture_samples_rl_only_when_every_part_has_it(tmp_path):
    mixture = EnvParams(name="mixture")
    folders = envs.split_dirs(mixture, tmp_path, "rl")
    assert len(folders) > 1
    folders[0].mkdir(parents=True)
    assert prompt_split("train", str(tmp_path), mixture) == "train"
    for folder in folders[1:]:
        folder.mkdir(parents=True)
    assert prompt_split("train", str(tmp_path), mixture) == "rl"
