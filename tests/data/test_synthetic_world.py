"""The synthetic world: deterministic, OSV-5M labels from reverse_geocoder, disjoint splits, location cues."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import math
import zipfile

import numpy as np
import pytest
import reverse_geocoder
from data_helpers import TINY_GEO, TINY_WORLD
from PIL import Image

from vlmgym.data import layout
from vlmgym.envs.geospot import synthetic
from vlmgym.envs.geospot.scene import Place, render_scene
from vlmgym.params import ParamsError


def read_rows(raw, split):
    with layout.csv_path(raw, split).open(newline="") as f:
        return list(csv.DictReader(f))


def haversine_km(lat1, lon1, lat2, lon2):
    p1, p2 = math.radians(lat1), math.radians(lat2)
    a = math.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(math.radians(lon2 - lon1) / 2) ** 2
    return 2 * 6371.0 * math.asin(math.sqrt(a))


def tree_digest(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_layout_header_and_zips(tiny_raw):
    assert layout.present_splits(tiny_raw) == ["train", "test", "test_ood"]
    for split, count in (("train", TINY_WORLD.train_images), ("test", TINY_WORLD.test_images),
                         ("test_ood", TINY_WORLD.ood_images)):
        assert layout.read_header(layout.csv_path(tiny_raw, split)) == list(layout.OSV5M_COLUMNS)
        rows = read_rows(tiny_raw, split)
        assert len(rows) == count
        assert all(len(r["id"]) == 16 and r["id"].isdigit() for r in rows)
        assert all(r["thumb_original_url"] == "" and r["climate"] == "" for r in rows)  # unknown columns empty
        members = {}
        for path in layout.split_zips(tiny_raw, split):
            with zipfile.ZipFile(path) as archive:
                members.update({name: archive.read(name) for name in archive.namelist()})
        assert sorted(members) == sorted(f"{r['id']}.jpg" for r in rows)
        image = Image.open(io.BytesIO(next(iter(members.values()))))
        assert image.size == (TINY_WORLD.image_width, TINY_WORLD.image_height) and image.format == "JPEG"


def test_deterministic_per_seed(tiny_raw, tmp_path):
    again = tmp_path / "again"
    synthetic.write_synthetic_raw(TINY_WORLD, again)
    assert tree_digest(again) == tree_digest(tiny_raw)
    other = tmp_path / "other"
    synthetic.write_synthetic_raw(dataclasses.replace(TINY_WORLD, seed=4, train_images=10, test_images=4), other)
    assert read_rows(other, "train")[0]["id"] != read_rows(tiny_raw, "train")[0]["id"]


def test_labels_are_reverse_geocoder_labels(tiny_raw):
    for split in layout.SPLITS:
        rows = read_rows(tiny_raw, split)
        found = reverse_geocoder.search([(float(r["latitude"]), float(r["longitude"])) for r in rows], mode=1,
                                        verbose=False)
        for row, truth in zip(rows, found):
            assert (row["country"], row["region"], row["sub-region"], row["city"]) == (
                truth["cc"], truth["admin1"], truth["admin2"], truth["name"])
            admin2 = truth["admin2"] or "NaN"
            assert row["unique_region"] == f"{truth['admin1'] or 'NaN'}_{truth['cc']}"
            assert row["unique_city"] == f"{truth['name']}_{admin2}_{truth['admin1'] or 'NaN'}_{truth['cc']}"
            assert row["unique_country"] == truth["cc"]


def test_countries_spread_and_closed_label_set(tiny_raw):
    countries = synthetic.pick_countries(TINY_GEO)
    assert len(countries) == 3
    rows = read_rows(tiny_raw, "train") + read_rows(tiny_raw, "test")
    assert {r["country"] for r in rows} == set(countries)
    table = synthetic.gazetteer()
    centres = [(table.lat[table.cc == c].mean(), table.lon[table.cc == c].mean()) for c in countries]
    gaps = [haversine_km(*a, *b) for i, a in enumerate(centres) for b in centres[i + 1:]]
    assert min(gaps) > 3000  # well separated over the globe
    # The same countries whatever the seed: the class set is a property of the params, not of the draw.
    assert synthetic.pick_countries(dataclasses.replace(TINY_GEO)) == countries


def test_explicit_countries_and_unknown_code():
    chosen = dataclasses.replace(TINY_GEO, countries=["FR", "BR"])
    assert synthetic.pick_countries(chosen) == ["BR", "FR"]
    with pytest.raises(ParamsError, match="data.geospot.countries.*XX"):
        synthetic.pick_countries(dataclasses.replace(TINY_GEO, countries=["FR", "XX"]))


def test_train_and_test_places_disjoint(tiny_raw):
    train, test = read_rows(tiny_raw, "train"), read_rows(tiny_raw, "test")
    assert not {r["id"] for r in train} & {r["id"] for r in test}
    closest = min(haversine_km(float(a["latitude"]), float(a["longitude"]), float(b["latitude"]),
                               float(b["longitude"])) for a in test for b in train)
    assert closest >= synthetic.TEST_MIN_DISTANCE_KM
    # Disjoint spots, shared cities: the city level stays learnable (as in OSV-5M).
    assert {r["unique_city"] for r in test} & {r["unique_city"] for r in train}


def test_ood_split_is_tests_task_under_the_shift(tiny_raw, tmp_path):
    train, test, ood = (read_rows(tiny_raw, split) for split in ("train", "test", "test_ood"))
    assert not {r["id"] for r in ood} & {r["id"] for r in train + test}
    # same places as test (the anchors), kept as far from train as test is: only the rendering differs
    assert {r["country"] for r in ood} == {r["country"] for r in test}
    closest = min(haversine_km(float(a["latitude"]), float(a["longitude"]), float(b["latitude"]),
                               float(b["longitude"])) for a in ood for b in train)
    assert closest >= synthetic.TEST_MIN_DISTANCE_KM
    assert TINY_GEO.ood_shift == "fog"
    row = [ood[0][c] for c in layout.OSV5M_COLUMNS]
    fog = Image.open(io.BytesIO(synthetic.render_row(row, TINY_WORLD, "test_ood", 0, "fog", TINY_GEO.ood_strength)))
    clear = Image.open(io.BytesIO(synthetic.render_row(row, TINY_WORLD, "test_ood", 0)))
    with zipfile.ZipFile(layout.split_zips(tiny_raw, "test_ood")[0]) as archive:
        written = Image.open(io.BytesIO(archive.read(f"{ood[0]['id']}.jpg")))
    assert np.abs(np.asarray(written, int) - np.asarray(fog, int)).mean() < 2  # what was written is the fog
    full = Image.open(io.BytesIO(synthetic.render_row(row, TINY_WORLD, "test_ood", 0, "fog", 1.0)))
    fog_px, clear_px, full_px = (np.asarray(image, float) for image in (fog, clear, full))
    assert full_px.std() < 0.7 * clear_px.std()  # a veil: less contrast
    assert TINY_GEO.ood_strength == 0.5 and full_px.std() < fog_px.std() < clear_px.std()  # the default's is thinner
    # no ood_images: no test_ood split, and train/test are unchanged bytes
    plain = tmp_path / "plain"
    synthetic.write_synthetic_raw(dataclasses.replace(TINY_WORLD, ood_images=0), plain)
    assert layout.present_splits(plain) == ["train", "test"]
    assert layout.csv_path(plain, "test").read_bytes() == layout.csv_path(tiny_raw, "test").read_bytes()


def test_night_shift_darkens_and_unknown_shift_is_an_error():
    place = Place(48.4, -4.5, "FR", "Bretagne_FR", "Brest_Finistere_Bretagne_FR")
    day = np.asarray(render_scene(place, np.random.default_rng(7), 96, 72), float)
    night = np.asarray(render_scene(place, np.random.default_rng(7), 96, 72, shift="night"), float)
    assert night.mean() < 0.5 * day.mean() and night[..., 2].mean() > night[..., 0].mean()
    with pytest.raises(ValueError, match="unknown shift 'snow'"):
        render_scene(place, np.random.default_rng(7), 96, 72, shift="snow")


def test_jitter_stays_near_anchor_places(tiny_raw):
    table = synthetic.gazetteer()
    for row in read_rows(tiny_raw, "train")[:20]:
        lat, lon = float(row["latitude"]), float(row["longitude"])
        mask = table.cc == row["country"]
        nearest = min(haversine_km(lat, lon, a, o) for a, o in zip(table.lat[mask], table.lon[mask]))
        assert nearest < 6 * TINY_GEO.jitter_km


def test_scene_depends_on_place_not_only_on_nuisance():
    base = Place(48.4, -4.5, "FR", "Bretagne_FR", "Brest_Finistere_Bretagne_FR")
    again = np.asarray(render_scene(base, np.random.default_rng(7), 96, 72))
    assert np.array_equal(again, np.asarray(render_scene(base, np.random.default_rng(7), 96, 72)))
    for changed in (dataclasses.replace(base, country="JP"), dataclasses.replace(base, unique_region="Normandie_FR"),
                    dataclasses.replace(base, unique_city="Quimper_Finistere_Bretagne_FR"),
                    dataclasses.replace(base, latitude=5.0)):
        other = np.asarray(render_scene(changed, np.random.default_rng(7), 96, 72))
        assert np.abs(other.astype(int) - again.astype(int)).mean() > 1.0, changed


def test_country_is_learnable_from_pixels(tiny_raw):
    """A nearest-centroid classifier on 12x9 thumbnails beats chance by far: the country cue is in the pixels."""
    def features(split):
        rows = read_rows(tiny_raw, split)
        images = {}
        for path in layout.split_zips(tiny_raw, split):
            with zipfile.ZipFile(path) as archive:
                images.update({n: archive.read(n) for n in archive.namelist()})
        x = np.stack([np.asarray(Image.open(io.BytesIO(images[f"{r['id']}.jpg"])).resize((12, 9)), float).ravel()
                      for r in rows])
        return x, np.array([r["country"] for r in rows])

    x_train, y_train = features("train")
    x_test, y_test = features("test")
    classes = sorted(set(y_train))
    centroids = np.stack([x_train[y_train == c].mean(axis=0) for c in classes])
    predicted = np.array(classes)[np.argmin(((x_test[:, None] - centroids[None]) ** 2).sum(-1), axis=1)]
    assert (predicted == y_test).mean() > 1.5 / len(classes)


@pytest.mark.parametrize("shift", ["fog", "night"])
def test_a_milder_shift_stays_between_the_clean_scene_and_the_full_shift(shift):
    place = Place(48.4, -4.5, "FR", "Bretagne_FR", "Brest_Finistere_Bretagne_FR")

    def render(**kwargs):
        return np.asarray(render_scene(place, np.random.default_rng(7), 96, 72, **kwargs), float)

    clean, half, full = render(), render(shift=shift, strength=0.5), render(shift=shift)
    assert np.array_equal(full, render(shift=shift, strength=1.0))  # the default is the full shift
    distance = [np.abs(image - clean).mean() for image in (half, full)]
    assert 0.3 * distance[1] < distance[0] < 0.7 * distance[1]
