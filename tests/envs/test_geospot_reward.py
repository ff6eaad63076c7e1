"""The geospot reward: perfect answers score 1 at every curriculum point, rewards fall with distance, partial
answers never beat full ones, garbage scores 0, and the antimeridian and the poles are handled."""

import math
import random
from dataclasses import dataclass, field

import pytest
from adversarial import NAMELESS, adversarial, hedged, negated
from geographiclib.geodesic import Geodesic
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from vlmgym.envs import make
from vlmgym.envs.geospot import render_answer
from vlmgym.envs.geospot.parse import parse_answer
from vlmgym.envs.geospot.reward import LEVELS, curriculum, taus
from vlmgym.envs.geospot.settings import GeospotParams
from vlmgym.geo import country_display_name, gazetteer
from vlmgym.params import ParamsError

IMAGE = Image.new("RGB", (4, 4))
progress = st.floats(0, 1)


@dataclass
class Sample:
    key: str
    images: list = field(default_factory=lambda: [IMAGE])
    meta: dict = field(default_factory=dict)


def sample_at(key: str, lat: float, lon: float, cc: str, region: str, city: str) -> Sample:
    return Sample(key, meta={"id": key, "latitude": lat, "longitude": lon, "country": cc, "region": region,
                             "sub_region": "", "city": city})


def random_samples(count: int, seed: int) -> list[Sample]:
    """Samples at random gazetteer places, labelled the OSV-5M way (reverse geocoding the coordinates)."""
    gaz, rng = gazetteer(), random.Random(seed)
    samples = []
    while len(samples) < count:
        p = gaz.place(rng.randrange(len(gaz)))
        lat, lon = p.lat + rng.uniform(-0.01, 0.01), p.lon + rng.uniform(-0.01, 0.01)
        if abs(lat) > 90 or abs(lon) > 180:
            continue
        label = gaz.reverse(lat, lon)
        samples.append(sample_at(str(len(samples)), lat, lon, label.cc, label.admin1, label.name))
    no_region = next(gaz.place(i) for i in range(len(gaz)) if not gaz.admin1[i])
    samples.append(sample_at("no-region", no_region.lat, no_region.lon, no_region.cc, "", no_region.name))
    return samples


@pytest.fixture(scope="module")
def env():
    return make("geospot", samples=random_samples(200, seed=1))


@pytest.fixture(scope="module")
def states(env):
    return [env.reset(i)[0] for i in range(len(env))]


def reward(env, state, text, at=0.0):
    env.set_progress(at)
    _, _, value, done, info = env.step_text(state, text)
    assert done
    assert value == info["reward"]
    return value, info


@settings(max_examples=150, deadline=None)
@given(index=st.integers(0, 200), at=progress)
def test_perfect_answer_scores_one_at_every_curriculum_point(env, states, index, at):
    state = states[index]
    value, info = reward(env, state, env.ideal_answer(state.meta, exact=True), at)
    assert value == pytest.approx(1.0, abs=1e-12)
    assert info["format_ok"] and not info["unresolved"]
    assert info["parse_failures"] == ([] if state.meta["region"] else ["region: missing"])
    assert reward(env, state, env.ideal_answer(state.meta), at)[0] > 0.999  # the 4-decimal SFT target


def test_sample_without_region_still_scores_one(env, states):
    state = states[-1]
    assert state.meta["region"] == ""
    value, info = reward(env, state, env.ideal_answer(state.meta, exact=True), 0.5)
    assert value == pytest.approx(1.0)
    assert info["truth_unresolved"] == ["region: ''"] and info["d_region_km"] is None


def answer_at(meta: dict, lat: float, lon: float, names: bool) -> str:
    if not names:
        return f"Latitude: {lat!r}\nLongitude: {lon!r}"
    return render_answer(country_display_name(meta["country"]), meta["region"], meta["city"], lat, lon, None)


@settings(max_examples=100, deadline=None)
@given(index=st.integers(0, 199), azimuth=st.floats(-180, 180), near=st.floats(0, 3000),
       extra=st.floats(0.001, 3000), names=st.booleans(), at=progress)
def test_reward_falls_monotonically_with_distance(env, states, index, azimuth, near, extra, names, at):
    state = states[index]
    lat, lon = state.meta["latitude"], state.meta["longitude"]
    line = Geodesic.WGS84.Line(lat, lon, azimuth)
    values, distances = [], []
    for d_km in (near, near + extra):
        point = line.Position(d_km * 1000)
        value, info = reward(env, state, answer_at(state.meta, point["lat2"], point["lon2"], names), at)
        values.append(value)
        distances.append(info["d_coords_km"])
    assert distances[0] == pytest.approx(near, abs=1e-6) and distances[1] == pytest.approx(near + extra, abs=1e-6)
    assert values[0] >= values[1]
    assert values[0] > values[1] or values[1] == 0.0 or values[0] - values[1] < 1e-12


@settings(max_examples=100, deadline=None)
@given(index=st.integers(0, 200), at=progress)
def test_country_only_never_beats_a_full_correct_answer(env, states, index, at):
    state = states[index]
    full, _ = reward(env, state, env.ideal_answer(state.meta), at)
    country_only, info = reward(env, state, f"Country: {country_display_name(state.meta['country'])}", at)
    assert info["k_country"] == 1.0
    assert country_only < full
    assert country_only <= 1 - env.params.format_weight  # keeps the other levels' weights in the denominator


def test_country_only_never_beats_full_even_with_country_only_weights(states):
    params = GeospotParams(curriculum_progress=[0.0], curriculum_weights=[[1.0, 0.0, 0.0, 0.0]])
    env = make("geospot", samples=[Sample("p", meta=states[0].meta)], params=params)
    state = env.reset(0)[0]
    full, _ = reward(env, state, env.ideal_answer(state.meta, exact=True))
    country_only, _ = reward(env, state, f"Country: {state.meta['country']}")
    assert country_only <= full == 1.0


@pytest.mark.parametrize("text", ["", " ", "asdf", "I have no idea where this is.", "🙂", "\x00\x01",
                                  "Latitude: 1e308\nLongitude: -1e308", "Latitude: " + "9" * 500,
                                  "Latitude: 99999999999999999999\nLongitude: 99999999999999999999",
                                  "Country: Atlantis\nRegion: Mordor\nCity: Xqzvil", None])
def test_garbage_scores_zero(env, states, text):
    for at in (0.0, 0.6, 1.0):
        value, info = reward(env, states[0], text, at)
        assert value == 0.0
        assert all(info[f"k_{level}"] == 0.0 for level in LEVELS)


def test_other_answers_and_junk_score_nothing(env, states):
    """Tags, spam, JSON, other envs' answers: no format share and next to no content. The bound is a tolerance,
    not 0: the inline form reads two numbers as a coordinate guess and comma-separated words as names, which
    exp(-d / tau) never scores exactly 0 (digit spam lies thousands of km away; "[NaN, Infinity, ...]" names the
    city Nan, Thailand, and earns ~3e-4 on the samples nearest it)."""
    for text in adversarial("geospot"):
        for state in states:
            value, info = reward(env, state, text)
            assert value < 1e-3 and not info["format_ok"], (state.meta["id"], text[:80], value)


BANIYAS = sample_at("baniyas", 35.18, 35.95, "SY", "Tartus", "Baniyas")  # near the table's nameless row in Tartus


@pytest.mark.parametrize("name", ["💩", "!!!", "—", "…", "?!", "🙂 🙂", "~~", "*-*"])
def test_names_of_nothing_score_nothing_at_any_level(name):
    """A name without a letter or digit is a missing name: no level resolves it (the table's nameless rows
    included), so it adds nothing to the reward that the answer without it gets."""
    env = make("geospot", samples=[BANIYAS])
    state = env.reset(0)[0]
    coords = "Latitude: 35.2\nLongitude: 36.0"
    for names in ([name, None, None], [None, name, None], [None, None, name], [name, name, name]):
        lines = [f"{key}: {value}" for key, value in zip(("Country", "Region", "City"), names) if value]
        missing = [f"{key}:" for key, value in zip(("Country", "Region", "City"), names) if value]
        for tail in ("", coords):
            value, info = reward(env, state, "\n".join([*lines, tail]))
            assert all(info[f"k_{level}"] == 0.0 for level in ("country", "region", "city")), (names, tail)
            assert info["pred_city"] is None and info["pred_region"] is None and info["pred_country"] is None
            assert value == reward(env, state, "\n".join([*missing, tail]))[0]
            assert tail or value == 0.0


def test_nameless_answers_in_the_shared_junk_score_zero():
    env = make("geospot", samples=[BANIYAS])
    state = env.reset(0)[0]
    for text in NAMELESS:
        assert reward(env, state, text)[0] == 0.0, text


@pytest.mark.parametrize("level, right, wrong", [("Country", "France", "Spain"), ("City", "Paris", "Lyon"),
                                                 ("Region", "Ile-de-France", "Normandy")])
def test_negated_two_and_hedged_names_earn_no_more_than_the_name(level, right, wrong):
    """A negated name or two names on one line name no place; a hedge never earns more than the bare name does."""
    env = make("geospot", samples=[sample_at("paris", 48.8566, 2.3522, "FR", "Ile-de-France", "Paris")])
    state = env.reset(0)[0]
    bare = reward(env, state, f"{level}: {right}")[0]
    assert bare > 0  # the right name alone is paid: the zeros below are the wording's doing
    for text in negated(right, wrong):
        assert reward(env, state, f"{level}: {text}")[0] == 0.0, text
    for text in hedged(right):
        assert reward(env, state, f"{level}: {text}")[0] <= bare, text


garbage = st.text(st.characters(blacklist_characters="0123456789:=：-–—,;|\n", blacklist_categories=("Nd",)))


@settings(max_examples=200, deadline=None)
@given(index=st.integers(0, 200), text=garbage, at=progress)
def test_text_without_fields_scores_zero(env, states, index, text, at):
    assert reward(env, states[index], text, at)[0] == 0.0


@settings(max_examples=200, deadline=None)
@given(index=st.integers(0, 200), text=st.text(max_size=200), at=progress)
def test_any_text_scores_within_bounds(env, states, index, text, at):
    value, _ = reward(env, states[index], text, at)
    assert 0.0 <= value <= 1.0 and math.isfinite(value)


def test_well_formatted_nonsense_earns_only_the_format_share(env, states):
    state = states[0]
    far_lat, far_lon = -state.meta["latitude"], state.meta["longitude"] + (180 if state.meta["longitude"] < 0 else -180)
    text = f"Country: Atlantis\nRegion: Mordor\nCity: Xqzvil\nLatitude: {far_lat}\nLongitude: {far_lon}"
    value, info = reward(env, state, text)
    assert info["format_ok"] and info["unresolved"] == ["country: 'Atlantis'", "region: 'Mordor'", "city: 'Xqzvil'"]
    assert value == pytest.approx(env.params.format_weight, abs=1e-12)


def test_antimeridian_answers_are_near(env):
    fiji_west = sample_at("fj", -16.8, 179.95, "FJ", "Northern", "Labasa")
    env_fj = make("geospot", samples=[fiji_west])
    state = env_fj.reset(0)[0]
    _, info = reward(env_fj, state, "Latitude: -16.8\nLongitude: -179.95")
    assert info["d_coords_km"] == pytest.approx(10.66, abs=0.05)  # 0.1 degree of longitude, not 359.9
    assert info["k_coords"] == pytest.approx(math.exp(-info["d_coords_km"] / 25))


def test_polar_answers(env):
    pole = sample_at("pole", -90.0, 0.0, "AQ", "", "")
    env_pole = make("geospot", samples=[pole])
    state = env_pole.reset(0)[0]
    _, info = reward(env_pole, state, "Latitude: 90 S\nLongitude: 123.4 W")
    assert info["d_coords_km"] == pytest.approx(0.0, abs=1e-9) and info["k_coords"] == 1.0
    _, info = reward(env_pole, state, "Latitude: 89.9 S\nLongitude: 55")
    assert info["d_coords_km"] == pytest.approx(11.17, abs=0.05)


def test_names_score_by_distance_between_representative_points(env):
    paris = sample_at("paris", 48.8534, 2.3488, "FR", "Ile-de-France", "Paris")
    env_paris = make("geospot", samples=[paris])
    state = env_paris.reset(0)[0]
    _, info = reward(env_paris, state, "Country: Germany\nRegion: Bavaria\nCity: Munich")
    gaz = gazetteer()
    assert info["d_country_km"] == pytest.approx(gaz.place_distance_km(gaz.country_point("DE").index,
                                                                       gaz.country_point("FR").index))
    assert 600 < info["d_city_km"] < 700 and info["k_city"] == pytest.approx(math.exp(-info["d_city_km"] / 100))
    assert (info["pred_country"], info["pred_region"], info["truth_city"]) == ("DE", "Bavaria, DE",
                                                                              "Paris, Ile-de-France, FR")
    _, info = reward(env_paris, state, "Country: France\nRegion: Brittany\nCity: Paris")
    assert info["k_country"] == 1.0 and info["k_city"] == 1.0 and 0 < info["k_region"] < 1


def test_info_names_every_component(env, states):
    _, info = reward(env, states[0], env.ideal_answer(states[0].meta), 0.3)
    for level in LEVELS:
        for key in (f"k_{level}", f"d_{level}_km", f"w_{level}", f"tau_{level}_km"):
            assert key in info
    for key in ("reward", "content_reward", "format_reward", "format_ok", "parse_failures", "unresolved",
                "curriculum_stage", "progress", "pred_country", "truth_country", "pred_latitude"):
        assert key in info
    assert info["curriculum_stage"] == 1
    assert sum(info[f"w_{level}"] for level in LEVELS) == pytest.approx(1.0)
    components = info["reward_components"]  # what the trainer logs: numbers only
    assert all(isinstance(v, float) for v in components.values())
    assert {"k_country", "k_region", "k_city", "k_coords", "content", "format", "w_city"} <= set(components)
    _, info = reward(env, states[0], "Country: Atlantis", 0.3)
    assert info["reward_components"]["unresolved_names"] == 1.0 and info["reward_components"]["k_country"] == 0.0


def test_curriculum_interpolates_between_stages():
    params = GeospotParams()
    assert curriculum(params, 0.0) == (0, tuple(params.curriculum_weights[0]))
    stage, weights = curriculum(params, 0.125)
    expected = [(a + b) / 2 for a, b in zip(params.curriculum_weights[0], params.curriculum_weights[1])]
    assert stage == 0 and weights == pytest.approx(expected)
    assert curriculum(params, 0.9) == (3, tuple(params.curriculum_weights[3]))
    assert curriculum(params, 7.0) == curriculum(params, 1.0)
    assert curriculum(params, float("nan")) == curriculum(params, 0.0)


@settings(max_examples=50, deadline=None)
@given(a=progress, b=progress)
def test_curriculum_moves_weight_from_coarse_to_fine(a, b):
    params = GeospotParams()
    low, high = sorted((a, b))
    w_low, w_high = curriculum(params, low)[1], curriculum(params, high)[1]
    assert w_low[0] / sum(w_low) >= w_high[0] / sum(w_high) - 1e-12  # the country's share only shrinks


def test_tau_schedule_tightens_geometrically():
    params = GeospotParams(tau_end_factor=0.25)
    assert taus(params, 0.0) == tuple(params.tau_km)
    assert taus(params, 1.0) == pytest.approx([t / 4 for t in params.tau_km])
    assert taus(params, 0.5) == pytest.approx([t / 2 for t in params.tau_km])
    assert taus(GeospotParams(), 1.0) == tuple(GeospotParams().tau_km)


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"tau_km": [1.0, 2.0]}, "tau_km"),
    ({"curriculum_progress": [0.1, 0.5]}, "curriculum_progress"),
    ({"curriculum_progress": [0.0, 0.5, 0.5]}, "curriculum_progress"),
    ({"curriculum_progress": [0.0], "curriculum_weights": [[1.0, 1.0, 1.0]]}, "curriculum_weights[0]"),
    ({"curriculum_progress": [0.0], "curriculum_weights": [[0.0, 0.0, 0.0, 0.0]]}, "curriculum_weights[0]"),
    ({"curriculum_weights": [[1.0, 1.0, 1.0, 1.0]]}, "curriculum_weights"),
])
def test_bad_reward_params_are_rejected(kwargs, fragment):
    with pytest.raises(ParamsError, match=fragment.replace("[", r"\[")):
        GeospotParams(**kwargs)


def test_parser_and_reward_agree_on_format(env, states):
    text = env.ideal_answer(states[3].meta)
    assert parse_answer(text).format_ok
    assert reward(env, states[3], text)[1]["format_reward"] == 1.0
