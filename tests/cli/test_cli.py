"""The `vlmgym` dispatcher's own options: --version, and a --help that lists every command and benchmark."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from vlmgym import cli
from vlmgym.bench import BENCHMARKS

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_the_installed_packages(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"vlmgym {metadata.version('vlmgym')}\n"


def test_version_falls_back_to_pyproject_when_not_installed(monkeypatch, capsys):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"vlmgym {expected}\n"


def test_version_from_the_command_line():
    done = subprocess.run([sys.executable, "-m", "vlmgym.cli", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout == f"vlmgym {metadata.version('vlmgym')}\n", done.stderr


@pytest.mark.parametrize("argv", [[], ["--help"], ["-h"], ["help"]])
def test_help_lists_every_command_and_every_benchmark(argv, capsys):
    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    # Each entry as the table has it (name, then its help), so a benchmark added to vlmgym.bench.BENCHMARKS
    # without showing in --help fails here.
    for table in (cli.COMMANDS, BENCHMARKS):
        for name, (_, help_) in table.items():
            assert any(line.split(maxsplit=1) == [name, help_] for line in lines), name
    assert any(line.split()[:1] == ["--version"] for line in lines)


def test_bench_help_still_lists_the_benchmarks(capsys):
    assert cli.main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in BENCHMARKS) and out.startswith("usage: vlmgym bench <benchmark>")


def test_an_unknown_command_is_an_error(capsys):
    assert cli.main(["no-such-command"]) == 2
    assert "unknown command 'no-such-command'" in capsys.readouterr().err
