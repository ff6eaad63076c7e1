"""params.yaml loading: typed sections, and errors that name the key, the value and the file."""

from pathlib import Path

import pytest

from vlmgym import params

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def test_repo_params_file_validates():
    sections = params.load_all(REPO / "params.yaml")
    assert set(sections) == set(params.SECTIONS)
    assert sections["data"].source in ("synthetic", "hub")


def test_defaults_fill_missing_keys(tmp_path):
    data = params.load_section("data", write(tmp_path, "data:\n  seed: 7\n"))
    assert data.seed == 7
    assert data.train_images == params.DataParams().train_images


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("data:\n  sed: 3\n", ["data.sed", "unknown key", "3"]),
        ("data:\n  seed: three\n", ["data.seed", "'three'", "integer"]),
        ("data:\n  seed: -1\n", ["data.seed", "-1", ">= 0"]),
        ("data:\n  source: ftp\n", ["data.source", "'ftp'", "synthetic"]),
        ("data:\n  seed: true\n", ["data.seed", "True", "integer"]),
        ("data:\n  countries: FR\n", ["data.countries", "'FR'", "list"]),
        ("shard:\n  jpeg_quality: 101\n", ["shard.jpeg_quality", "101", "<= 100"]),
    ],
)
def test_bad_values_name_key_value_and_file(tmp_path, text, fragments):
    path = write(tmp_path, text)
    with pytest.raises(params.ParamsError) as err:
        params.load_all(path)
    message = str(err.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message


def test_unknown_section_is_an_error(tmp_path):
    with pytest.raises(params.ParamsError, match="unknown section"):
        params.load_all(write(tmp_path, "trian:\n  lr: 0.1\n"))


def test_ints_are_accepted_for_floats(tmp_path):
    model = params.load_section("model", write(tmp_path, "model:\n  parity_tolerance: 1\n"))
    assert model.parity_tolerance == 1.0 and isinstance(model.parity_tolerance, float)


def test_cli_reports_errors(tmp_path, capsys):
    assert params.main([str(write(tmp_path, "data:\n  seed: x\n"))]) == 1
    assert "data.seed" in capsys.readouterr().out
    assert params.main([str(REPO / "params.yaml")]) == 0


def test_exponent_without_dot_is_a_float(tmp_path):
    # YAML 1.1 (PyYAML) reads `3e-5` as a string; `dvc exp run -S train.lr=3e-5` writes exactly that.
    train = params.load_section("train", write(tmp_path, "train:\n  lr: 3e-5\n"))
    assert train.lr == 3e-5
    with pytest.raises(params.ParamsError, match="train.lr"):
        params.load_section("train", write(tmp_path, "train:\n  lr: fast\n"))
