"""Street-scene renderer of the synthetic world: what each image encodes about its place.

Cues by scale (all derived from the place's labels and coordinates, so the
image is a function of the truth plus nuisance):
- country: a large banner (2-3 stripes from a fixed palette, horizontal or
  vertical), the road-sign shape and colours, road surface, centre-line colour
  and style, edge lines, and the real drive side (cars ahead in the own lane
  show red tail lights, oncoming cars white headlights).
- region (admin1): building wall hue, roof colour, and a two-colour plate on the
  roadside.
- city: building height profile, window colour and grid, and a billboard
  emblem (a 3x3 pattern in two colours).
- continuous: sun height and sky colour follow latitude; a horizon haze tint
  cycles smoothly with longitude; ground, vegetation density, tree shape and
  snow follow a climate proxy of (latitude, longitude).
Nuisance: camera pitch/roll/yaw, lighting and colour cast, clouds, trees,
poles, pedestrians, car colours and positions, banner position and size,
sensor noise, JPEG quality.

Shifts (`SHIFTS`, the out-of-distribution test split's rendering; train never shows them): `fog` veils the scene
in grey, thickest at the horizon where the banner, signs and buildings stand; `night` darkens everything and turns
it blue. Every cue stays in the image, fainter; a shift draws nothing from the RNG, so the nuisance is the same
as without it.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

# Countries that drive on the left (the rest drive on the right).
LEFT_DRIVING = frozenset({
    "AG", "AI", "AU", "BB", "BD", "BM", "BN", "BS", "BT", "BW", "CY", "DM", "FJ", "FK", "GB", "GD", "GG", "GY",
    "HK", "IE", "IM", "IN", "JE", "JM", "JP", "KE", "KI", "KN", "KY", "LC", "LK", "LS", "MO", "MS", "MT", "MU",
    "MV", "MW", "MY", "MZ", "NA", "NP", "NR", "NZ", "PG", "PK", "PN", "SB", "SC", "SG", "SH", "SR", "SZ", "TC",
    "TH", "TL", "TO", "TT", "TV", "TZ", "UG", "VC", "VG", "VI", "WS", "ZA", "ZM", "ZW",
})

PALETTE = (
    (200, 30, 40), (240, 130, 20), (245, 210, 30), (30, 150, 60), (20, 150, 150), (30, 70, 190),
    (20, 30, 100), (120, 40, 160), (220, 50, 160), (245, 245, 245), (20, 20, 20), (120, 70, 30),
)
SIGN_SHAPES = ("circle", "triangle", "diamond", "octagon", "square")
LINE_STYLES = ("solid", "dashed", "double")


@dataclass(frozen=True)
class Place:
    """What the renderer knows about an image's location: its labels and coordinates."""

    latitude: float
    longitude: float
    country: str
    unique_region: str
    unique_city: str


def stable_unit(text: str, salt: str) -> float:
    """A number in [0, 1) fixed by (text, salt): the same place always gets the same cue."""
    digest = hashlib.blake2b(f"{salt}\x00{text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def stable_index(text: str, salt: str, n: int) -> int:
    """An index in range(n) fixed by (text, salt)."""
    return int(stable_unit(text, salt) * n)


def _hue_rgb(hue: float, saturation: float, value: float) -> tuple[int, int, int]:
    h = (hue % 1.0) * 6
    c = value * saturation
    x = c * (1 - abs(h % 2 - 1))
    r, g, b = [(c, x, 0), (x, c, 0), (0, c, x), (0, x, c), (x, 0, c), (c, 0, x)][int(h) % 6]
    m = value - c
    return int(255 * (r + m)), int(255 * (g + m)), int(255 * (b + m))


def _mix(a, b, t: float) -> np.ndarray:
    return np.asarray(a, float) * (1 - t) + np.asarray(b, float) * t


def climate(latitude: float, longitude: float) -> tuple[float, float]:
    """(warmth, wetness) in [0, 1]: a smooth proxy, warm at the equator, wet/dry bands varying with longitude."""
    warmth = math.cos(math.radians(latitude)) ** 1.5
    wet = 0.5 + 0.3 * math.sin(math.radians(longitude) * 2 + 0.7) * math.cos(math.radians(latitude) * 3)
    wet += 0.2 * math.cos(math.radians(latitude) * 4)
    return warmth, min(1.0, max(0.0, wet))


SHIFTS = ("fog", "night")
FOG_RGB = (196, 199, 204)


def render_scene(place: Place, rng: np.random.Generator, width: int, height: int,
                 shift: str | None = None, strength: float = 1.0) -> Image.Image:
    """Render one street scene for `place`; `rng` draws the nuisance; `shift` (one of SHIFTS) the weather or time
    of day of the out-of-distribution split, at `strength` (0: none, 1: full)."""
    if shift is not None and shift not in SHIFTS:
        raise ValueError(f"render_scene: unknown shift {shift!r}; expected one of {SHIFTS}")
    warmth, wetness = climate(place.latitude, place.longitude)
    horizon = int(height * (0.42 + rng.uniform(-0.06, 0.06)))  # camera pitch
    vanish_x = width * (0.5 + rng.uniform(-0.15, 0.15))  # camera yaw
    pixels = np.empty((height, width, 3), float)
    sun_elevation = float(np.clip(90 - abs(place.latitude) + rng.uniform(-12, 12), 3, 88))
    _paint_sky(pixels, horizon, sun_elevation, place.longitude)
    _paint_ground(pixels, horizon, warmth, wetness, rng)
    image = Image.fromarray(pixels.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    _draw_sun_and_clouds(draw, rng, width, horizon, sun_elevation, wetness)
    _draw_road(draw, place.country, width, height, horizon, vanish_x)
    _draw_buildings(draw, place, rng, width, height, horizon, vanish_x)
    _draw_trees(draw, rng, width, height, horizon, warmth, wetness)
    _draw_cars(draw, place.country, rng, width, height, horizon, vanish_x)
    _draw_signs(draw, place, rng, width, height, horizon)
    _draw_banner(draw, place.country, rng, width, height, horizon)
    if shift is not None:
        image = _apply_shift(image, shift, horizon, strength)
    return _camera_and_sensor(image, rng)


def _apply_shift(image: Image.Image, shift: str, horizon: int, strength: float = 1.0) -> Image.Image:
    pixels = np.asarray(image, np.float32)
    if shift == "fog":
        rows = np.arange(pixels.shape[0], dtype=np.float32)
        # at full strength 0.5 of the scene's contrast left in the foreground, 0.2 at the horizon
        veil = strength * (0.5 + 0.3 * np.exp(-np.abs(rows - horizon) / (0.2 * pixels.shape[0])))
        pixels = pixels * (1 - veil[:, None, None]) + np.asarray(FOG_RGB, np.float32) * veil[:, None, None]
    else:  # night, at full strength: a third of the light, tinted blue
        dark = np.asarray((0.28, 0.32, 0.42), np.float32)
        scale = dark + (1 - strength) * (1 - dark)  # exactly `dark` at full strength
        pixels = pixels * scale + strength * np.asarray((4, 6, 18), np.float32)
    return Image.fromarray(pixels.clip(0, 255).astype(np.uint8))


def _paint_sky(pixels: np.ndarray, horizon: int, sun_elevation: float, longitude: float) -> None:
    high_sun = sun_elevation / 90
    zenith = _mix((150, 165, 190), (35, 85, 200), high_sun)
    bottom = _mix((235, 175, 130), (200, 220, 240), high_sun)
    haze = np.asarray(_hue_rgb((longitude + 180) / 360, 0.45, 0.95), float)  # periodic in longitude
    bottom = _mix(bottom, haze, 0.35)
    t = np.linspace(0, 1, max(horizon, 1))[:, None, None]
    pixels[:horizon] = zenith * (1 - t) + bottom * t


def _paint_ground(pixels: np.ndarray, horizon: int, warmth: float, wetness: float, rng: np.random.Generator) -> None:
    ground = _mix((195, 170, 115), (70, 135, 55), wetness)
    snow = float(np.clip((0.45 - warmth) / 0.25, 0, 1))
    ground = _mix(ground, (225, 230, 235), snow)
    rows = pixels.shape[0] - horizon
    shade = np.linspace(0.8, 1.05, max(rows, 1))[:, None, None]
    pixels[horizon:] = ground * shade * rng.uniform(0.92, 1.08)


def _draw_sun_and_clouds(draw, rng, width, horizon, sun_elevation, wetness) -> None:
    sun_y = horizon * (1 - 0.9 * sun_elevation / 90)
    sun_x = rng.uniform(0.1, 0.9) * width
    r = max(4, width // 30)
    draw.ellipse((sun_x - r, sun_y - r, sun_x + r, sun_y + r), fill=(255, 245, 200))
    for _ in range(rng.poisson(1 + 4 * wetness)):
        cx, cy = rng.uniform(0, width), rng.uniform(0, horizon * 0.7)
        w, h = rng.uniform(0.08, 0.25) * width, rng.uniform(0.03, 0.08) * width
        grey = int(rng.uniform(200, 250))
        draw.ellipse((cx - w, cy - h, cx + w, cy + h), fill=(grey, grey, grey))


def _road_x(t: float, side: float, width: int, vanish_x: float) -> float:
    """x of a point across the road (side in [-1, 1]) at depth t (0 at the bottom, 1 at the horizon)."""
    half = 0.45 * width * (1 - t) + 0.01 * width * t
    center = width / 2 * (1 - t) + vanish_x * t
    return center + side * half


def _road_y(t: float, height: int, horizon: int) -> float:
    return height - (height - horizon) * t


def _draw_road(draw, country, width, height, horizon, vanish_x) -> None:
    surface = ((70, 70, 72), (105, 105, 110), (120, 85, 70), (50, 55, 65))[stable_index(country, "road", 4)]
    quad = [(_road_x(0, -1, width, vanish_x), height), (_road_x(0, 1, width, vanish_x), height),
            (_road_x(1, 1, width, vanish_x), horizon), (_road_x(1, -1, width, vanish_x), horizon)]
    draw.polygon(quad, fill=surface)
    line_colour = ((245, 245, 245), (245, 200, 30))[stable_index(country, "line", 2)]
    style = LINE_STYLES[stable_index(country, "style", len(LINE_STYLES))]
    offsets = (-0.025, 0.025) if style == "double" else (0.0,)
    steps = 12
    for k in range(steps):
        if style == "dashed" and k % 2:
            continue
        t0, t1 = k / steps, (k + 1) / steps
        for off in offsets:
            lw0, lw1 = 0.015 * (1 - t0), 0.015 * (1 - t1)
            draw.polygon([(_road_x(t0, off - lw0, width, vanish_x), _road_y(t0, height, horizon)),
                          (_road_x(t0, off + lw0, width, vanish_x), _road_y(t0, height, horizon)),
                          (_road_x(t1, off + lw1, width, vanish_x), _road_y(t1, height, horizon)),
                          (_road_x(t1, off - lw1, width, vanish_x), _road_y(t1, height, horizon))], fill=line_colour)
    if stable_index(country, "edges", 2):
        for side in (-0.93, 0.93):
            draw.line([(_road_x(0, side, width, vanish_x), height), (_road_x(1, side, width, vanish_x), horizon)],
                      fill=(235, 235, 235), width=max(1, width // 120))


def _draw_buildings(draw, place, rng, width, height, horizon, vanish_x) -> None:
    wall = _hue_rgb(stable_unit(place.unique_region, "wall"), 0.35, 0.85)
    roof = PALETTE[stable_index(place.unique_region, "roof", len(PALETTE))]
    tallness = 0.6 + 1.2 * stable_unit(place.unique_city, "height")
    window = ((250, 220, 120), (120, 170, 220), (40, 45, 60))[stable_index(place.unique_city, "window", 3)]
    window_rows = 2 + stable_index(place.unique_city, "window_rows", 3)
    for side in (-1, 1):
        for t in sorted(rng.uniform(0.25, 0.8, size=rng.integers(1, 4)), reverse=True):
            scale = 1 - t
            x_edge = _road_x(t, side * 1.15, width, vanish_x)
            w = width * 0.28 * scale * rng.uniform(0.8, 1.2)
            h = height * 0.9 * scale * tallness * rng.uniform(0.85, 1.15)
            base = _road_y(t, height, horizon)
            x0, x1 = (x_edge - w, x_edge) if side < 0 else (x_edge, x_edge + w)
            draw.rectangle((x0, base - h, x1, base), fill=wall)
            draw.rectangle((x0, base - h - h * 0.08, x1, base - h), fill=roof)
            for r in range(window_rows):
                for c in range(3):
                    wx = x0 + w * (0.12 + 0.3 * c)
                    wy = base - h + h * (0.12 + 0.8 * r / window_rows)
                    draw.rectangle((wx, wy, wx + w * 0.16, wy + h * 0.4 / window_rows), fill=window)


def _draw_trees(draw, rng, width, height, horizon, warmth, wetness) -> None:
    leaf = _mix((120, 125, 60), (30, 110, 40), wetness).astype(int)
    conifer = warmth < 0.55
    for _ in range(rng.poisson(1 + 6 * wetness)):
        x = rng.uniform(0, width)
        base = rng.uniform(horizon + 2, height * 0.85)
        size = (base - horizon) / (height - horizon) * height * 0.35 + 4
        draw.rectangle((x - size * 0.05, base - size * 0.4, x + size * 0.05, base), fill=(90, 60, 35))
        if conifer:
            draw.polygon([(x - size * 0.3, base - size * 0.3), (x + size * 0.3, base - size * 0.3),
                          (x, base - size * 1.2)], fill=tuple(leaf))
        else:
            draw.ellipse((x - size * 0.35, base - size * 1.1, x + size * 0.35, base - size * 0.35), fill=tuple(leaf))


def _draw_cars(draw, country, rng, width, height, horizon, vanish_x) -> None:
    own_side = -0.5 if country in LEFT_DRIVING else 0.5
    cars = [(own_side, True)] + [(-own_side, False)] * int(rng.integers(0, 2)) + [(own_side, True)] * int(
        rng.integers(0, 2))
    for side, ahead in sorted(((s, a) for s, a in cars), key=lambda _: rng.uniform()):
        t = rng.uniform(0.2, 0.75)
        scale = 1 - t
        cx, base = _road_x(t, side, width, vanish_x), _road_y(t, height, horizon)
        w, h = width * 0.3 * scale, width * 0.2 * scale
        body = tuple(int(v) for v in rng.integers(30, 230, size=3))
        draw.rectangle((cx - w / 2, base - h, cx + w / 2, base), fill=body)
        draw.rectangle((cx - w * 0.35, base - h * 1.35, cx + w * 0.35, base - h), fill=body)
        lamp = (230, 20, 20) if ahead else (255, 255, 210)
        lw = max(1.0, w * 0.14)
        for lx in (cx - w / 2 + lw * 0.3, cx + w / 2 - lw * 1.3):
            draw.rectangle((lx, base - h * 0.6, lx + lw, base - h * 0.35), fill=lamp)


def _draw_signs(draw, place, rng, width, height, horizon) -> None:
    # Country road sign on a pole.
    x = rng.uniform(0.05, 0.95) * width
    r = width * rng.uniform(0.045, 0.065)
    y = horizon + rng.uniform(-0.1, 0.05) * height
    draw.rectangle((x - 1, y, x + 1, y + 3.5 * r), fill=(110, 110, 110))
    face = PALETTE[stable_index(place.country, "sign_face", len(PALETTE))]
    rim = PALETTE[stable_index(place.country, "sign_rim", len(PALETTE))]
    shape = SIGN_SHAPES[stable_index(place.country, "sign_shape", len(SIGN_SHAPES))]
    box = (x - r, y - r, x + r, y + r)
    if shape == "circle":
        draw.ellipse(box, fill=face, outline=rim, width=max(1, int(r / 3)))
    elif shape == "square":
        draw.rectangle(box, fill=face, outline=rim, width=max(1, int(r / 3)))
    else:
        sides, rotation = {"triangle": (3, 90), "diamond": (4, 0), "octagon": (8, 22.5)}[shape]
        draw.regular_polygon((x, y, r), sides, rotation=rotation, fill=face, outline=rim, width=max(1, int(r / 3)))
    # Region plate: two colours stacked.
    px, py = rng.uniform(0.05, 0.85) * width, horizon + rng.uniform(0.02, 0.2) * height
    pw, ph = width * 0.12, height * 0.06
    top = _hue_rgb(stable_unit(place.unique_region, "plate_top"), 0.8, 0.9)
    bottom = _hue_rgb(stable_unit(place.unique_region, "plate_bottom"), 0.8, 0.6)
    draw.rectangle((px, py, px + pw, py + ph / 2), fill=top)
    draw.rectangle((px, py + ph / 2, px + pw, py + ph), fill=bottom)
    # City emblem billboard: a 3x3 pattern in two colours.
    bx, by = rng.uniform(0.05, 0.8) * width, rng.uniform(0.05, 0.3) * height
    cell = width * rng.uniform(0.03, 0.04)
    ink = PALETTE[stable_index(place.unique_city, "emblem_ink", len(PALETTE))]
    paper = _hue_rgb(stable_unit(place.unique_city, "emblem_paper"), 0.3, 1.0)
    bits = stable_index(place.unique_city, "emblem_bits", 512)
    draw.rectangle((bx - 2, by - 2, bx + 3 * cell + 2, by + 3 * cell + 2), fill=paper)
    for k in range(9):
        if bits >> k & 1:
            cx, cy = bx + (k % 3) * cell, by + (k // 3) * cell
            draw.rectangle((cx, cy, cx + cell, cy + cell), fill=ink)


def _draw_banner(draw, country, rng, width, height, horizon) -> None:
    stripes = 2 + stable_index(country, "stripes", 2)
    colours = [PALETTE[stable_index(country, f"stripe{k}", len(PALETTE))] for k in range(stripes)]
    vertical = stable_index(country, "vertical", 2) == 1
    bw, bh = width * 0.24 * rng.uniform(0.85, 1.15), height * 0.18 * rng.uniform(0.85, 1.15)
    x0 = rng.uniform(0.02, 0.98) * width - bw / 2
    y0 = rng.uniform(0.05, 0.3) * height
    draw.rectangle((x0 - 2, y0, x0, horizon + 0.2 * height), fill=(90, 90, 90))
    for k, colour in enumerate(colours):
        if vertical:
            draw.rectangle((x0 + bw * k / stripes, y0, x0 + bw * (k + 1) / stripes, y0 + bh), fill=colour)
        else:
            draw.rectangle((x0, y0 + bh * k / stripes, x0 + bw, y0 + bh * (k + 1) / stripes), fill=colour)


def _camera_and_sensor(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    image = image.rotate(rng.uniform(-3, 3), resample=Image.NEAREST, fillcolor=(128, 128, 128))
    pixels = np.asarray(image, np.float32)
    gain = np.float32(rng.uniform(0.75, 1.15))
    cast = rng.uniform(-12, 12, size=3).astype(np.float32)
    noise = rng.standard_normal(size=pixels.shape[:2] + (1,), dtype=np.float32) * np.float32(rng.uniform(2, 7))
    pixels *= gain
    pixels += cast
    pixels += noise
    np.clip(pixels, 0, 255, out=pixels)
    return Image.fromarray(pixels.astype(np.uint8))
