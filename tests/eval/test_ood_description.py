"""Report headings name the out-of-distribution shift the data settings generated, not every shift an env offers."""

from __future__ import annotations

import pytest

from vlmgym import envs
from vlmgym.eval.outputs import shift_heading
from vlmgym.params import load_all


def data_section(tmp_path, text):
    path = tmp_path / "params.yaml"
    path.write_text("data:\n" + text)
    return load_all(path)["data"]


@pytest.mark.parametrize(("env", "settings", "named", "not_named"), [
    ("geospot", "  geospot:\n    ood_shift: night\n", "rendered at night", "fog"),
    ("geospot", "  seed: 1\n", "rendered in fog", "night"),
    ("digits", "  digits:\n    ood_shift: rotate\n", "turned 20-40 degrees (data.digits.ood_shift: rotate)", "invert"),
    ("digits", "  seed: 1\n", "light ink on a dark background (data.digits.ood_shift: invert)", "rotate"),
    ("message_decoding", "  message_decoding:\n    max_length: 6\n", "words of 7-8 letters", "shuffled"),
    ("message_decoding", "  message_decoding:\n    ood_shift: shuffled\n", "out of alphabetical order", "longer"),
    ("rec", "  rec:\n    ood_min_objects: 6\n    ood_max_objects: 8\n", "crowded scenes of 6-8 objects", "7-9"),
    ("ovd", "  ovd:\n    ood_min_objects: 6\n    ood_max_objects: 8\n", "crowded scenes of 6-8 objects", "7-9"),
    ("nlvr2", "  nlvr2:\n    ood_object_scale: 1.5\n", "scaled 1.5x (train and test: 3x", "2x"),
])
def test_each_env_names_the_configured_shift(tmp_path, env, settings, named, not_named):
    cls = envs.env_class(env)
    note = cls.ood_description(data_section(tmp_path, settings))
    assert named in note and not_named not in note
    heading = shift_heading(cls, "test", "test_ood", note)
    assert heading == f"In distribution (test) and out of it (test_ood: {note})"


def test_without_settings_the_general_note_stands():
    for name in ("geospot", "digits", "message_decoding", "rec", "ovd", "nlvr2"):
        cls = envs.env_class(name)
        assert cls.ood_description(None) == cls.ood_note
        expected = f"In distribution (test) and out of it (test_ood: {cls.ood_note})"
        assert shift_heading(cls, "test", "test_ood") == expected
