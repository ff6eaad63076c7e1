"""`vlmgym bench reward`: geospot rewards per second on one core, after the gazetteer has loaded.

Truths are random gazetteer places with jittered coordinates; answers are a fixed mix of what a policy writes
(perfect, near misses, wrong country, country only, markdown, inline, garbage), every one distinct, with the
training progress sweeping the whole curriculum. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from PIL import Image

from vlmgym.envs.base import Env


class _Sample:
    def __init__(self, key: str, image: Image.Image, meta: dict):
        self.key, self.images, self.meta = key, [image], meta


def make_cases(num_samples: int, num_answers: int, seed: int) -> tuple[list[_Sample], list[tuple[int, str]]]:
    """Samples at random places and (sample index, answer text) pairs; deterministic given `seed`."""
    from vlmgym.geo import country_display_name, gazetteer

    gaz = gazetteer()
    rng = random.Random(seed)
    image = Image.new("RGB", (4, 4))
    samples = []
    for i in range(num_samples):
        p = gaz.place(rng.randrange(len(gaz)))
        lat = max(-90.0, min(90.0, p.lat + rng.uniform(-0.02, 0.02)))
        lon = max(-180.0, min(180.0, p.lon + rng.uniform(-0.02, 0.02)))
        samples.append(_Sample(str(i), image, {"id": str(i), "latitude": lat, "longitude": lon, "country": p.cc,
                                               "region": p.admin1, "sub_region": p.admin2, "city": p.name}))
    answers = []
    for j in range(num_answers):
        s = rng.randrange(num_samples)
        m = samples[s].meta
        other = gaz.place(rng.randrange(len(gaz)))
        lat, lon = m["latitude"] + rng.gauss(0, 1), m["longitude"] + rng.gauss(0, 1)
        country = country_display_name(m["country"])
        kind = j % 7
        if kind == 0:
            text = (f"Country: {country}\nRegion: {m['region']}\nCity: {m['city']}\n"
                    f"Latitude: {lat:.4f}\nLongitude: {lon:.4f}")
        elif kind == 1:
            text = (f"Country: {country_display_name(other.cc)}\nRegion: {other.admin1}\nCity: {other.name}\n"
                    f"Latitude: {other.lat:.3f}\nLongitude: {other.lon:.3f}")
        elif kind == 2:
            text = f"Country: {m['country']}"
        elif kind == 3:
            text = (f"**Country:** {country}\n- **State:** {other.admin1}\n- **City:** {m['city']}\n"
                    f"- Lat: {abs(lat):.2f}° {'N' if lat >= 0 else 'S'}\n"
                    f"- Lng: {abs(lon):.2f}° {'E' if lon >= 0 else 'W'}")
        elif kind == 4:
            text = f"{m['city']}, {m['region']}, {country}, {lat:.3f}, {lon:.3f}"
        elif kind == 5:
            text = f"I am not sure {j}, maybe somewhere warm."
        else:
            text = f"Country: {country}\nRegion: {m['region']}\nCity: {other.name}\nLatitude: {lat:.2f}\nLongitude: x"
        answers.append((s, text))
    return samples, answers


def run(num_samples: int = 2000, num_answers: int = 30000, seed: int = 0) -> dict:
    """Time env.step_text over the generated answers; returns the figures."""
    from vlmgym.envs import make

    start = time.perf_counter()
    samples, answers = make_cases(num_samples, num_answers, seed)
    env: Env = make("geospot", samples=samples)
    states = [env.reset(i)[0] for i in range(len(env))]
    setup_s = time.perf_counter() - start
    total = 0.0
    wall, cpu = time.perf_counter(), time.process_time()
    for n, (s, text) in enumerate(answers):
        env.set_progress(n / num_answers)
        total += env.step_text(states[s], text)[2]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"benchmark": "geospot_reward", "answers": num_answers, "samples": num_samples, "seed": seed,
            "rewards_per_s": round(num_answers / wall, 1), "us_per_reward": round(1e6 * wall / num_answers, 2),
            # on a shared machine wall time includes waiting for a core; CPU time is the one-core figure
            "rewards_per_cpu_s": round(num_answers / cpu, 1), "cpu_over_wall": round(cpu / wall, 3),
            "mean_reward": round(total / num_answers, 4),
            "setup_s_incl_gazetteer_load": round(setup_s, 2)}


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, print JSON."""
    parser = argparse.ArgumentParser(prog="vlmgym bench reward", description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000, help="distinct truths")
    parser.add_argument("--answers", type=int, default=30000, help="answers scored (all distinct)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.samples < 1 or args.answers < 1:
        parser.error("--samples and --answers must be >= 1")
    print(json.dumps(run(args.samples, args.answers, args.seed)))
    return 0
