"""The env API: registry, reset/step contract, tokens vs text, shards, and the geospot env built on it."""

import io
import json

import pytest
import webdataset as wds
from PIL import Image

from vlmgym import envs
from vlmgym.envs import Env
from vlmgym.envs.geospot import PROMPT, GeospotEnv
from vlmgym.envs.geospot.settings import GeospotParams
from vlmgym.geo import country_display_name, gazetteer

PARIS = {"id": "1", "latitude": 48.8534, "longitude": 2.3488, "country": "FR", "region": "Ile-de-France",
         "sub_region": "Paris", "city": "Paris"}
TOKYO = {"id": "2", "latitude": 35.6895, "longitude": 139.6917, "country": "JP", "region": "Tokyo",
         "sub_region": "", "city": "Tokyo"}


class Sample:
    def __init__(self, key, meta, images=None):
        self.key, self.meta = key, meta
        self.images = images if images is not None else [Image.new("RGB", (8, 6), (10, 20, 30))]


class WordTokenizer:
    """Token ids are indices into a word list; decode joins them (what the env needs of a tokenizer)."""

    words = ["Country:", "France", "\n", "<eos>"]

    def decode(self, ids, skip_special_tokens=False):
        words = [self.words[i] for i in ids if not (skip_special_tokens and self.words[i] == "<eos>")]
        return " ".join(words).replace(" \n ", "\n")


@pytest.fixture
def clean_registry(scoped_envs):
    """The envs a test registers are undone after it."""


def test_builtin_envs_are_registered():
    assert {"geospot", "nlvr2"} <= set(envs.names())
    assert envs.env_class("geospot") is GeospotEnv
    assert issubclass(envs.env_class("nlvr2"), Env)


def test_unknown_env_names_the_known_ones():
    with pytest.raises(KeyError, match="geospot"):
        envs.make("geospotz")


def test_register_validates(clean_registry):
    class Echo(Env):
        name = "echo"

    envs.register("echo", Echo)
    envs.register("echo", Echo)  # the same target again is fine
    with pytest.raises(ValueError, match="already registered"):
        envs.register("echo", GeospotEnv)
    envs.register("echo", GeospotEnv, overwrite=True)
    with pytest.raises(ValueError, match="module:Class|package.module:ClassName"):
        envs.register("bad", "no_colon_here")
    with pytest.raises(TypeError):
        envs.register("bad", dict)
    envs.register("lazy", "vlmgym.envs.geospot:NoSuchEnv")
    with pytest.raises(ImportError, match="NoSuchEnv"):
        envs.make("lazy")


def test_lazy_string_targets_import_on_first_use(clean_registry):
    envs.register("geo2", "vlmgym.envs.geospot:GeospotEnv")
    env = envs.make("geo2", samples=[Sample("a", PARIS)])
    assert isinstance(env, GeospotEnv)


def test_reset_and_step_contract():
    env = envs.make("geospot", samples=[Sample("a", PARIS), Sample("b", TOKYO)], tokenizer=WordTokenizer())
    assert len(env) == 2
    state, obs = env.reset(3)  # wraps around
    assert state.key == "b" and state.meta == TOKYO and not state.done
    assert obs["images"][0].size == (8, 6)
    assert obs["messages"] == [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
    new_state, next_obs, reward, done, info = env.step(state, [0, 1, 3])
    assert (next_obs, done, new_state.done, new_state.answer) == ([], True, True, "Country: France")
    assert not state.done  # steps never mutate: a group of answers is scored against one reset
    assert (reward, info) == env.step_text(state, "Country: France")[2::2]
    assert info["pred_country"] == "FR" and info["truth_country"] == "JP" and 0 < info["k_country"] < 1


def test_step_needs_a_tokenizer_for_token_ids():
    env = envs.make("geospot", samples=[Sample("a", PARIS)])
    state, _ = env.reset(0)
    with pytest.raises(ValueError, match="tokenizer"):
        env.step(state, [1, 2, 3])
    assert env.step(state, env.ideal_answer(PARIS))[2] == pytest.approx(1.0)


def test_progress_is_clamped():
    env = envs.make("geospot", samples=[Sample("a", PARIS)], progress=0.4)
    assert env.progress == 0.4
    for given, expected in ((-1, 0.0), (2, 1.0), (float("nan"), 0.0), (0.25, 0.25)):
        env.set_progress(given)
        assert env.progress == expected


def test_geospot_rejects_malformed_samples():
    with pytest.raises(ValueError, match="'x'.*2 images"):
        envs.make("geospot", samples=[Sample("x", PARIS, images=[Image.new("RGB", (2, 2))] * 2)])
    with pytest.raises(ValueError, match="latitude"):
        envs.make("geospot", samples=[Sample("y", {"country": "FR"})])
    with pytest.raises(ValueError, match="no samples"):
        envs.make("geospot", samples=[])
    env = envs.make("geospot", samples=[Sample("z", {**PARIS, "latitude": "north-ish"})])
    with pytest.raises(ValueError, match="sample 1: latitude 'north-ish'"):
        env.reset(0)


def write_shard(folder, samples):
    folder.mkdir(parents=True)
    with wds.TarWriter(str(folder / "shard-000000.tar")) as sink:
        for key, meta in samples:
            buffer = io.BytesIO()
            Image.new("RGB", (16, 12), (200, 100, 50)).save(buffer, format="JPEG")
            sink.write({"__key__": key, "jpg": buffer.getvalue(), "json": json.dumps(meta).encode()})


def test_geospot_reads_webdataset_shards(tmp_path):
    write_shard(tmp_path / "shards" / "test", [("000000", PARIS), ("000001", TOKYO)])
    env = envs.make("geospot", shards_dir=str(tmp_path / "shards"), split="test")
    assert len(env) == 2
    state, obs = env.reset(1)
    assert state.meta["city"] == "Tokyo" and obs["images"][0].size == (16, 12)
    assert env.step_text(state, env.ideal_answer(TOKYO))[2] == pytest.approx(1.0)
    assert len(envs.make("geospot", shards_dir=str(tmp_path / "shards"), split="test", limit=1)) == 1


def test_ideal_answer_layout():
    env = envs.make("geospot", samples=[Sample("a", PARIS)])
    assert env.ideal_answer(PARIS) == ("Country: France\nRegion: Ile-de-France\nCity: Paris\n"
                                       "Latitude: 48.8534\nLongitude: 2.3488")
    tokyo = {**TOKYO, "latitude": 35.68951234, "region": ""}
    env2 = envs.make("geospot", samples=[Sample("a", PARIS)], params=GeospotParams(answer_decimals=2))
    assert env2.ideal_answer(tokyo).splitlines() == [
        "Country: Japan", "Region:", "City: Tokyo", "Latitude: 35.69", "Longitude: 139.69"]
    assert env2.ideal_answer(tokyo, exact=True).splitlines()[3] == "Latitude: 35.68951234"


def test_geospot_corpus_covers_every_country_and_region():
    corpus = GeospotEnv.corpus()
    assert corpus[0] == PROMPT and corpus == GeospotEnv.corpus()  # deterministic
    assert 4000 < len(corpus) < 10000 and sum(map(len, corpus)) < 1_000_000
    text = "\n".join(corpus)
    gaz = gazetteer()
    for cc in gaz.countries():
        assert f"Country: {country_display_name(cc)}\n" in text
        for admin1 in gaz.regions(cc):
            assert f"Region: {admin1}\n" in text


def test_joint_corpus_calls_every_registered_env():
    joint = envs.corpus()
    assert PROMPT in joint
    assert set(envs.env_class("nlvr2").corpus()) <= set(joint)
