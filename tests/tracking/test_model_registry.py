"""The registered pyfunc model: its signature and input example, loading without warnings, and the `champion`
alias that the evaluate stage moves only to a version whose mean reward beats the champion's."""

from __future__ import annotations

import base64
import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from types import SimpleNamespace

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from vlmgym.tracking import model_registry as registry
from vlmgym.tracking import pyfunc_model

pytestmark = pytest.mark.slow


@pytest.fixture
def client(tmp_path):
    return MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")


def register(client, env_name: str, model_hash: str) -> str:
    """A new version of vlmgym-<env> tagged as the export stage tags one (no model behind it: the rule reads tags)."""
    name = registry.registered_name(env_name)
    if not client.search_registered_models(f"name = '{name}'"):
        client.create_registered_model(name)
    return str(client.create_model_version(name, source="file:///nowhere/model", tags={"dvc.hash": model_hash}).version)


def champion(client, env_name: str) -> str | None:
    version = client.get_registered_model(registry.registered_name(env_name)).aliases.get(registry.CHAMPION)
    return None if version is None else str(version)


def recorded(client, env_name: str, version: str) -> float:
    tags = client.get_model_version(registry.registered_name(env_name), version).tags
    return float(tags[registry.EVAL_TAG_PREFIX + registry.HEADLINE])


def test_the_first_evaluated_version_becomes_champion(client, capsys):
    v1 = register(client, "geospot", "h1")
    promotion = registry.promote_if_better(client, "geospot", "h1", 0.30, run_id="run-1")
    assert promotion is not None and promotion.moved and promotion.previous is None
    assert champion(client, "geospot") == v1
    tags = client.get_model_version("vlmgym-geospot", v1).tags
    assert float(tags["vlmgym.eval.mean_reward"]) == 0.30 and tags["vlmgym.eval.run_id"] == "run-1"
    assert "is the first champion" in capsys.readouterr().out


def test_the_alias_moves_only_to_a_higher_figure(client, capsys):
    v1, v2, v3, v4 = (register(client, "geospot", f"h{i}") for i in range(1, 5))
    registry.promote_if_better(client, "geospot", "h1", 0.30)
    worse = registry.promote_if_better(client, "geospot", "h2", 0.25)
    assert not worse.moved and champion(client, "geospot") == v1
    assert recorded(client, "geospot", v2) == 0.25  # every evaluated version carries its figure
    assert "does not beat version 1's 0.3000" in capsys.readouterr().out
    tie = registry.promote_if_better(client, "geospot", "h3", 0.30)
    assert not tie.moved and champion(client, "geospot") == v1
    better = registry.promote_if_better(client, "geospot", "h4", 0.41)
    assert better.moved and better.previous == v1 and better.previous_figure == 0.30
    assert champion(client, "geospot") == v4
    assert "beats version 1's 0.3000: it is the champion now" in capsys.readouterr().out
    # The champion evaluated again stays the champion, with its new figure.
    again = registry.promote_if_better(client, "geospot", "h4", 0.39)
    assert not again.moved and champion(client, "geospot") == v4 and recorded(client, "geospot", v4) == 0.39
    assert v3 != v4


def test_the_newest_version_of_the_evaluated_folder_is_the_one_judged(client):
    register(client, "geospot", "same")
    newest = register(client, "geospot", "same")  # the same folder exported again
    assert registry.promote_if_better(client, "geospot", "same", 0.2).version == newest


def test_a_champion_set_by_hand_without_a_figure_stays(client):
    register(client, "geospot", "h1")
    v2 = register(client, "geospot", "h2")
    client.set_registered_model_alias("vlmgym-geospot", registry.CHAMPION, "1")
    assert not registry.promote_if_better(client, "geospot", "h2", 0.9).moved
    assert champion(client, "geospot") == "1" and recorded(client, "geospot", v2) == 0.9


def test_each_env_has_its_own_champion(client):
    geo = register(client, "geospot", "g1")
    digits = register(client, "digits", "d1")
    registry.promote_if_better(client, "geospot", "g1", 0.8)
    # A lower figure of another env's model is never compared with geospot's: digits gets its own champion.
    assert registry.promote_if_better(client, "digits", "d1", 0.1).moved
    assert champion(client, "geospot") == geo and champion(client, "digits") == digits
    # The folder hash of one env's model is not looked for in another's.
    assert registry.promote_if_better(client, "digits", "g1", 0.9) is None
    assert champion(client, "digits") == digits


def test_a_version_not_found_or_no_figure_warns_once_and_moves_nothing(client, capsys):
    register(client, "geospot", "h1")
    assert registry.promote_if_better(client, "geospot", "other", 0.5) is None
    err = capsys.readouterr().err
    assert err.count("WARNING") == 1 and "no version of the registered model vlmgym-geospot" in err
    assert registry.promote_if_better(client, "geospot", "h1", float("nan")) is None
    assert capsys.readouterr().err.count("WARNING") == 1
    assert registry.promote_if_better(client, "nlvr2", "h1", 0.5) is None  # no registered model at all
    assert capsys.readouterr().err.count("WARNING") == 1
    assert champion(client, "geospot") is None


def test_an_unreachable_registry_warns_and_does_not_raise(monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    unreachable = MlflowClient("http://127.0.0.1:9")  # the discard port: nothing listens
    assert registry.promote_if_better(unreachable, "geospot", "h1", 0.5) is None
    captured = capsys.readouterr()
    assert captured.err.count("WARNING") == 1 and "could not be updated" in captured.err
    assert len(captured.err.strip().splitlines()) == 1


class QueuingRun(SimpleNamespace):
    """A stage run whose spool is a list; send() plays it to the registry as the spool's thread would."""

    def queue_model_entry(self, kind, **fields):
        self.queued.append({"kind": kind, "run_id": self.run_id, **fields})

    def send(self):
        for entry in self.queued:
            registry.send_entry(self.client, None, entry)


def test_the_evaluate_stage_judges_the_exported_folder_on_the_policy_mean_reward(client, tmp_path):
    version = register(client, "geospot", "folder-hash")
    run = QueuingRun(client=client, run_id="eval-run", tags={"dvc.dep.models/hf/grpo": "folder-hash"}, queued=[],
                     output_hash=lambda path: pytest.fail("the dep tag has the hash"))
    results = {"grpo": {"mean_reward": 0.42, "geoscore": 1900.0}, "sft": {"mean_reward": 0.9}}
    registry.promote_evaluated(run, "geospot", "models/hf/grpo", "grpo", results)
    assert champion(client, "geospot") is None  # queued, not sent
    assert run.queued == [{"kind": "promote", "run_id": "eval-run", "env_name": "geospot",
                           "model_hash": "folder-hash", "value": 0.42, "figure": "mean_reward"}]
    run.send()
    assert champion(client, "geospot") == version and recorded(client, "geospot", version) == 0.42
    # Without the dep tag the folder's hash is computed.
    other = register(client, "geospot", "computed")
    run = QueuingRun(client=client, run_id="eval-run-2", tags={}, queued=[], output_hash=lambda path: "computed")
    registry.promote_evaluated(run, "geospot", tmp_path / "hf", "grpo", {"grpo": {"mean_reward": 0.5}})
    run.send()
    assert champion(client, "geospot") == other


def test_a_figure_that_is_not_a_number_queues_no_promotion(client, capsys):
    run = QueuingRun(client=client, run_id="eval-run", tags={"dvc.dep.h": "x"}, queued=[])
    registry.promote_evaluated(run, "geospot", "h", "grpo", {"grpo": {"mean_reward": float("nan")}})
    assert run.queued == [] and "no finite mean_reward" in capsys.readouterr().err


def test_the_signature_describes_what_predict_takes():
    signature = pyfunc_model.signature(12)
    assert [(c.name, c.type.name, c.required) for c in signature.inputs.inputs] == [
        ("image", "binary", False), ("prompt", "string", True)]
    assert [(p.name, p.default) for p in signature.params.params] == [("max_new_tokens", 12)]
    rows = pyfunc_model.input_example()
    assert [sorted(row) for row in rows] == [["image", "prompt"]]
    assert len(rows[0]["image"]) < 1024 and Image.open(io.BytesIO(rows[0]["image"])).size == (32, 32)
    assert pyfunc_model.example_image() == rows[0]["image"]  # the same bytes every time


@pytest.mark.parametrize("encode", [lambda png: png, lambda png: base64.b64encode(png).decode(),
                                    lambda png: base64.encodebytes(png)],  # base64 bytes, as {"inputs": ...} gives
                         ids=["bytes", "base64-text", "base64-bytes"])
def test_an_image_is_read_however_it_is_encoded(encode):
    png = pyfunc_model.example_image()
    (obs,) = [pyfunc_model.observation(row) for row in pyfunc_model._rows([{"image": encode(png), "prompt": "p"}])]
    assert obs["images"][0].size == (32, 32)
    assert obs["messages"][0]["content"] == [{"type": "image"}, {"type": "text", "text": "p"}]


def test_a_row_without_an_image_has_none():
    # A row that leaves `image` out among rows that have it: NaN once pyfunc has made the rows a DataFrame.
    rows = [{"image": pyfunc_model.example_image(), "prompt": "a"}, {"image": float("nan"), "prompt": "b"}]
    first, second = (pyfunc_model.observation(row) for row in pyfunc_model._rows(rows))
    assert len(first["images"]) == 1 and second["images"] == []
    assert pyfunc_model.observation({"prompt": "b"}) == second
    assert second["messages"][0]["content"] == [{"type": "text", "text": "b"}]
    with pytest.raises(ValueError, match="neither encoded image bytes nor base64"):
        pyfunc_model.observation({"image": b"not an image", "prompt": "c"})


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@contextlib.contextmanager
def mlflow_warnings() -> Iterator[list[str]]:
    """The Python warnings and MLflow's WARNING log records of the block, as text (filled when it ends)."""
    handler, found = _Records(), []
    logger = logging.getLogger("mlflow")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield found
    finally:
        logger.removeHandler(handler)
    found += [str(w.message) for w in caught] + [r.getMessage() for r in handler.records]


def test_the_registered_champion_loads_without_warnings_and_answers(tmp_path, monkeypatch):
    """A tiny exported folder logged and registered as the export stage does (MLflow answers the input example
    once, through the serving path), promoted, then loaded from `models:/vlmgym-geospot@champion`."""
    from vlmgym.models.qwen3_vl.base_model import TinyDims, build_tiny
    from vlmgym.tracking.stage_runs import dvc_hash

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "hf"
    build_tiny(folder, [pyfunc_model.EXAMPLE_PROMPT, "Country: France"], seed=0,
               dims=TinyDims.scaled(hidden_size=64, num_layers=2), vocab_size=400)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    experiment = client.create_experiment("registry", artifact_location=(tmp_path / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=experiment), mlflow_warnings() as logging_warned:
        version = registry.log_and_register(folder, "geospot", max_new_tokens=4, client=client,
                                            lineage={"dvc.hash": dvc_hash(folder)})
    assert logging_warned == []  # no type-hint or signature warning; the input example served as it is
    assert registry.promote_if_better(client, "geospot", dvc_hash(folder), 0.5).version == str(version.version)
    with mlflow_warnings() as loading_warned:
        model = mlflow.pyfunc.load_model("models:/vlmgym-geospot@champion")
    assert loading_warned == []
    assert model.metadata.signature == pyfunc_model.signature(4)
    assert model.metadata.saved_input_example_info["serving_input_path"] == "serving_input_example.json"
    rows = pyfunc_model.input_example()
    answers = model.predict(rows + [{"image": base64.b64encode(rows[0]["image"]).decode(), "prompt": "p"},
                                    {"prompt": "no image"}], params={"max_new_tokens": 2})
    assert len(answers) == 3 and all(isinstance(a, str) for a in answers)
    assert answers[0] == answers[1]  # the same image, as bytes or as base64 text
