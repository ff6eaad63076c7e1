"""sft.perception: the vision tower learns an env's image labels, alone, and refuses what it cannot run."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from PIL import Image

from vlmgym.envs.base import Env, MissingPart
from vlmgym.envs.digits.env import DigitsEnv
from vlmgym.envs.mixture import MixtureEnv, MixtureParams
from vlmgym.params import LoRAParams, ParamsError, PerceptionParams, SFTParams, with_values
from vlmgym.rl import perception

COLOURS = ((200, 40, 40), (40, 200, 40), (40, 40, 200))


@dataclass
class Sample:
    key: str
    images: list
    meta: dict


class ColourEnv(Env):
    """Which of three colours fills the image: one head of three classes."""

    name = "colour_probe"
    perception_heads = (3,)

    def perception_labels(self, meta: dict) -> list[int]:
        return [meta["colour"]]

    def prompt(self, sample):
        return "Which colour?"

    def score(self, state, text):
        return 0.0, {}


class NoLabelsEnv(ColourEnv):
    name = "no_labels"
    perception_heads = ()


class QuadrantsEnv(ColourEnv):
    """Which colour fills each quarter of the image: token labels only, one per merged token (a 2 x 2 grid)."""

    name = "quadrants_probe"
    perception_heads = ()
    perception_token_heads = (3,)

    def perception_token_labels(self, meta: dict, rows: int, cols: int) -> list[list[int]]:
        assert (rows, cols) == (2, 2)
        return [[colour] for colour in meta["quadrants"]]


def quadrant_samples(count: int, seed: int) -> list[Sample]:
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(count):
        colours = rng.integers(0, 3, 4)
        pixels = np.zeros((64, 64, 3))
        for quarter, colour in enumerate(colours):
            row, col = divmod(quarter, 2)
            pixels[row * 32:(row + 1) * 32, col * 32:(col + 1) * 32] = COLOURS[colour]
        pixels = np.clip(pixels + rng.normal(0, 25, pixels.shape), 0, 255).astype(np.uint8)
        samples.append(Sample(f"{seed}-{i}", [Image.fromarray(pixels)], {"quadrants": colours.tolist()}))
    return samples


def colour_samples(count: int, seed: int, size: tuple[int, int] = (64, 64)) -> list[Sample]:
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(count):
        colour = i % 3
        pixels = np.clip(np.asarray(COLOURS[colour]) + rng.normal(0, 25, (*size, 3)), 0, 255).astype(np.uint8)
        samples.append(Sample(f"{seed}-{i}", [Image.fromarray(pixels)], {"colour": colour}))
    return samples


def section(tiny_vlm, **perception_settings) -> SFTParams:
    settings = {"steps": 40, "optimizer.lr": 1e-2, "optimizer.warmup_steps": 5, "batch_size": 6, "eval_every": 0,
                **perception_settings}
    return SFTParams(steps=1, init_dir=tiny_vlm.folder, perception=with_values(SFTParams().perception, settings))


def policy_of(tiny_vlm) -> SimpleNamespace:
    return SimpleNamespace(cfg=tiny_vlm.cfg, processor=tiny_vlm.processor)


def test_warm_up_learns_the_labels_and_changes_only_the_tower(tiny_vlm, tmp_path):
    env, val = ColourEnv(colour_samples(24, 0)), ColourEnv(colour_samples(12, 1))
    sft = section(tiny_vlm)
    warmup = perception.PerceptionWarmup(tiny_vlm.cfg, tiny_vlm.params, tiny_vlm.processor.settings, env, val,
                                         sft.perception, progress_bar=False)
    before = warmup.evaluate({"visual": tiny_vlm.params["visual"], "head": warmup.head})
    params, summary = warmup.run()
    assert before["perception/val_all_labels"] < 0.7  # a random head is not already right
    assert summary["perception/val_all_labels"] == 1.0
    assert summary["perception/val_label_accuracy"] == 1.0
    for name, value in tiny_vlm.params.items():
        same = jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), value, params[name]))
        assert same == (name != "visual"), name


def test_token_heads_teach_each_token_its_own_part_of_the_image(tiny_vlm):
    """A head shared by the tokens reads each token alone, so it is right only when every token carries its own
    quarter's colour (no image head: the labels are the token labels alone)."""
    env, val = QuadrantsEnv(quadrant_samples(48, 0)), QuadrantsEnv(quadrant_samples(24, 1))
    assert perception.split_arrays(env, tiny_vlm.processor.settings, "train").token_labels.shape == (48, 4, 1)
    warmup = perception.PerceptionWarmup(tiny_vlm.cfg, tiny_vlm.params, tiny_vlm.processor.settings, env, val,
                                         section(tiny_vlm, steps=60).perception, progress_bar=False)
    before = warmup.evaluate({"visual": tiny_vlm.params["visual"], "head": warmup.head})
    params, summary = warmup.run()
    assert before["perception/val_token_label_accuracy"] < 0.6
    assert "perception/val_label_accuracy" not in summary
    assert summary["perception/val_token_label_accuracy"] == 1.0
    assert summary["perception/val_all_token_labels"] == 1.0


class SolidViewEnv(QuadrantsEnv):
    """Shows the warm-up every sample as one solid colour, labelled so (an env's perception_view)."""

    name = "solid_view_probe"

    def perception_view(self, image, meta):
        return Image.new("RGB", image.size, COLOURS[2]), {**meta, "quadrants": [2, 2, 2, 2]}


def test_the_warm_up_reads_the_envs_view_of_each_sample(tiny_vlm):
    settings = tiny_vlm.processor.settings
    samples = quadrant_samples(3, 0)
    seen, shown = (perception.split_arrays(cls(samples), settings, "train") for cls in (SolidViewEnv, QuadrantsEnv))
    assert seen.token_labels.tolist() == [[[2]] * 4] * 3 != shown.token_labels.tolist()
    assert np.array_equal(seen.pixels[0], seen.pixels[2]) and not np.array_equal(seen.pixels[0], shown.pixels[0])


def test_shown_token_accuracy_counts_only_tokens_that_show_something(tiny_vlm, monkeypatch):
    """Calling every token empty scores the empty tokens' share on the plain accuracy and 0 on the shown one."""
    env, val = QuadrantsEnv(quadrant_samples(8, 0)), QuadrantsEnv(quadrant_samples(24, 1))
    warmup = perception.PerceptionWarmup(tiny_vlm.cfg, tiny_vlm.params, tiny_vlm.processor.settings, env, val,
                                         section(tiny_vlm, steps=1).perception, progress_bar=False)
    truth = warmup.val.token_labels
    monkeypatch.setattr(warmup, "val_predictions", lambda trained: (None, np.zeros_like(truth)))
    metrics = warmup.evaluate({})
    assert 0 < metrics["perception/val_token_label_accuracy"] == pytest.approx((truth == 0).mean())
    assert metrics["perception/val_shown_token_label_accuracy"] == 0.0
    monkeypatch.setattr(warmup, "val_predictions", lambda trained: (None, np.where(truth > 0, truth, 1)))
    assert warmup.evaluate({})["perception/val_shown_token_label_accuracy"] == 1.0


def test_token_labels_that_do_not_fit_name_the_sample(tiny_vlm):
    settings = tiny_vlm.processor.settings
    sample = quadrant_samples(1, 0)[0]
    three = QuadrantsEnv([Sample("short", sample.images, {"quadrants": [0, 1, 2]})])
    with pytest.raises(ValueError, match=r"gave 3 token labels for train sample short, whose image has 2 x 2 tokens"):
        perception.split_arrays(three, settings, "train")
    bad = QuadrantsEnv([Sample("odd", sample.images, {"quadrants": [0, 1, 2, 5]})])
    with pytest.raises(ValueError, match=r"labels \[5\] of quadrants_probe train sample odd do not fit its "
                                        r"perception_token_heads \(3,\)"):
        perception.split_arrays(bad, settings, "train")


def test_warm_up_is_kept_and_reused_by_a_resumed_run(tiny_vlm, tmp_path):
    env, val = ColourEnv(colour_samples(12, 0)), ColourEnv(colour_samples(6, 1))
    sft = section(tiny_vlm, steps=10, eval_every=5)
    logged, logged_again = [], []
    first, summary = perception.warm_up(policy_of(tiny_vlm), tiny_vlm.params, env, val, sft, tmp_path,
                                        log=lambda step, metrics: logged.append((step, dict(metrics))))
    assert (tmp_path / "perception" / perception.SUMMARY_FILE).is_file()
    # a resumed run reads the stored tower and figures; labels that would fail show it does not train again
    broken = ColourEnv([Sample(s.key, s.images, {"colour": 7}) for s in env.samples])
    again, summary_again = perception.warm_up(policy_of(tiny_vlm), tiny_vlm.params, broken, val, sft, tmp_path,
                                              log=lambda step, metrics: logged_again.append((step, dict(metrics))))
    assert summary_again == summary
    # ... and logs every step's figures again, from the journal (a forced rerun's new MLflow run gets them all)
    assert [step for step, _ in logged] == list(range(1, 11)) and logged_again == logged
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), first["visual"], again["visual"]))


def mixture(labelled: Env, other: Env) -> MixtureEnv:
    """A mixture over two registered names holding the given envs (the mixture reads only their samples)."""
    weights = {"digits": 1.0, "geospot": 1.0}
    return MixtureEnv({"digits": labelled, "geospot": other}, params=MixtureParams(envs=weights))


def test_a_mixture_warms_up_on_its_one_sub_env_with_labels(tiny_vlm, tmp_path):
    # the other sub-env's images are another size: a warm-up over the whole mixture would stop on them
    wide = NoLabelsEnv(colour_samples(8, 2, (64, 192)))
    train = mixture(ColourEnv(colour_samples(24, 0)), wide)
    val = mixture(ColourEnv(colour_samples(12, 1)), NoLabelsEnv(colour_samples(4, 3, (64, 192))))
    assert train.perception_source() is train.parts["digits"]
    params, summary = perception.warm_up(policy_of(tiny_vlm), tiny_vlm.params, train, val, section(tiny_vlm), tmp_path)
    assert summary["perception/val_all_labels"] == 1.0
    assert not jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), params["visual"],
                                         tiny_vlm.params["visual"]))
    both = mixture(ColourEnv(colour_samples(3, 0)), QuadrantsEnv(quadrant_samples(3, 0)))
    with pytest.raises(ValueError, match=r"sub-envs \['digits', 'geospot'\] all have perception labels"):
        perception.warm_up(policy_of(tiny_vlm), tiny_vlm.params, both, None, section(tiny_vlm), tmp_path / "both")
    with pytest.raises(MissingPart, match="env 'mixture' has no perception labels"):
        perception.check_supported(section(tiny_vlm), mixture(NoLabelsEnv(colour_samples(3, 0)), wide), 1)


def test_bad_labels_and_mixed_image_sizes_name_the_sample(tiny_vlm):
    settings = tiny_vlm.processor.settings
    bad = ColourEnv([Sample("odd", colour_samples(1, 0)[0].images, {"colour": 3})])
    with pytest.raises(ValueError, match=r"labels \[3\] of colour_probe train sample odd do not fit its "
                                        r"perception_heads \(3,\)"):
        perception.split_arrays(bad, settings, "train")
    mixed = ColourEnv(colour_samples(1, 0) + [Sample("wide", colour_samples(1, 0, (64, 192))[0].images,
                                                     {"colour": 0})])
    with pytest.raises(ValueError, match="train sample wide has a .* patch grid"):
        perception.split_arrays(mixed, settings, "train")


def test_refuses_what_it_cannot_run(tiny_vlm):
    env = ColourEnv(colour_samples(3, 0))
    with pytest.raises(MissingPart, match="env 'no_labels' has no perception labels"):
        perception.check_supported(section(tiny_vlm), NoLabelsEnv(colour_samples(3, 0)), 1)
    lora = SFTParams(steps=1, perception=PerceptionParams(steps=5), lora=LoRAParams(rank=4))
    with pytest.raises(ValueError, match="does not run with sft.lora.rank > 0"):
        perception.check_supported(lora, env, 1)
    with pytest.raises(ValueError, match="runs on one device in one process"):
        perception.check_supported(SFTParams(steps=1, perception=PerceptionParams(steps=5), mesh=[2, 1, 1]), env, 1)
    with pytest.raises(ValueError, match="runs on one device in one process"):
        perception.check_supported(section(tiny_vlm), env, 2)
    with pytest.raises(ParamsError, match="sft.perception.steps > 0 but sft.steps is 0"):
        SFTParams(steps=0, perception=PerceptionParams(steps=5))


def test_digits_labels_count_each_digit():
    env = DigitsEnv.__new__(DigitsEnv)
    assert env.perception_heads == (5,) * 10
    assert env.perception_labels({"digits": [3, 7, 3]}) == [0, 0, 0, 2, 0, 0, 0, 1, 0, 0]
