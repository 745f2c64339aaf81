"""Seeded real-looking images for `mmproc bench accuracy`, drawn here (nothing downloaded): photos (smooth noise,
as `bench serve` sends), documents (text lines on paper), screenshots (flat UI boxes with labels) and charts (axes,
bars, a line). Text is Pillow's built-in bitmap font: real glyph strokes, the same on every machine.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from mmproc.bench.images import image_rng, smooth_pixels

KINDS = ("photo", "document", "screenshot", "chart")
# (width, height) per kind: a camera frame, a portrait page, a desktop, a slide-sized chart.
SIZES = {"photo": (640, 480), "document": (612, 792), "screenshot": (1280, 720), "chart": (800, 600)}
_WORDS = ("the", "encoder", "maps", "image", "patches", "to", "tokens", "of", "a", "language", "model", "in", "order",
          "0123456789", "Total", "Q3")  # fmt: skip


def _font() -> ImageFont.ImageFont:
    return ImageFont.load_default()


def _text(rng: np.random.Generator, words: int) -> str:
    return " ".join(_WORDS[i] for i in rng.integers(len(_WORDS), size=words))


def photo(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    return Image.fromarray(smooth_pixels(rng, width, height), mode="RGB")


def document(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """Off-white paper, a bold title, paragraphs of dark lines with ragged right edges, a rule."""
    paper = tuple(int(v) for v in rng.integers(235, 256, size=3))
    image = Image.new("RGB", (width, height), paper)
    draw = ImageDraw.Draw(image)
    margin, y, font = width // 10, height // 12, _font()
    draw.text((margin, y), _text(rng, 4).upper(), fill=(10, 10, 10), font=font, stroke_width=1)
    y += 30
    while y < height - margin:
        for _ in range(int(rng.integers(3, 8))):  # one paragraph
            if y >= height - margin:
                break
            ink = int(rng.integers(0, 60))
            draw.text((margin, y), _text(rng, int(rng.integers(6, 12))), fill=(ink, ink, ink), font=font)
            y += 14
        y += 10
        if rng.random() < 0.2:
            draw.line((margin, y, width - margin, y), fill=(120, 120, 120), width=1)
            y += 8
    return image


def screenshot(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A window: title bar, sidebar with items, flat cards with labels and buttons."""
    bg = tuple(int(v) for v in rng.integers(200, 250, size=3))
    image = Image.new("RGB", (width, height), bg)
    draw, font = ImageDraw.Draw(image), _font()
    accent = tuple(int(v) for v in rng.integers(20, 200, size=3))
    draw.rectangle((0, 0, width, 36), fill=accent)
    draw.text((12, 12), _text(rng, 3), fill=(255, 255, 255), font=font)
    side = width // 5
    draw.rectangle((0, 36, side, height), fill=(40, 44, 52))
    for i in range(int(rng.integers(5, 12))):
        draw.text((16, 56 + 28 * i), _text(rng, 2), fill=(220, 220, 220), font=font)
    for _ in range(int(rng.integers(4, 9))):
        x0, y0 = int(rng.integers(side + 10, width - 200)), int(rng.integers(50, height - 120))
        x1, y1 = x0 + int(rng.integers(120, 320)), y0 + int(rng.integers(60, 160))
        draw.rectangle((x0, y0, x1, y1), fill=(255, 255, 255), outline=(180, 180, 180))
        draw.text((x0 + 8, y0 + 8), _text(rng, 3), fill=(30, 30, 30), font=font)
        draw.rectangle((x0 + 8, y1 - 28, x0 + 80, y1 - 8), fill=accent)
        draw.text((x0 + 14, y1 - 24), "OK", fill=(255, 255, 255), font=font)
    return image


def chart(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """White background, grid, axes with tick labels, coloured bars and a line series."""
    image = Image.new("RGB", (width, height), (255, 255, 255))
    draw, font = ImageDraw.Draw(image), _font()
    left, bottom, top, right = 70, height - 60, 50, width - 30
    for i in range(6):
        y = bottom - i * (bottom - top) // 5
        draw.line((left, y, right, y), fill=(225, 225, 225))
        draw.text((20, y - 6), str(i * 20), fill=(60, 60, 60), font=font)
    draw.line((left, top, left, bottom), fill=(0, 0, 0), width=2)
    draw.line((left, bottom, right, bottom), fill=(0, 0, 0), width=2)
    n = int(rng.integers(5, 12))
    step = (right - left) // n
    palette = [tuple(int(v) for v in rng.integers(30, 220, size=3)) for _ in range(3)]
    points = []
    for i in range(n):
        h = float(rng.uniform(0.1, 0.95)) * (bottom - top)
        x0 = left + i * step + step // 5
        draw.rectangle((x0, bottom - h, x0 + step * 3 // 5, bottom), fill=palette[i % 2])
        draw.text((x0, bottom + 8), f"Q{i + 1}", fill=(60, 60, 60), font=font)
        points.append((x0 + step * 3 // 10, bottom - float(rng.uniform(0.1, 0.95)) * (bottom - top)))
    draw.line(points, fill=palette[2], width=3)
    draw.text((left, 18), _text(rng, 5).title(), fill=(0, 0, 0), font=font)
    return image


DRAW: dict[str, Callable[[np.random.Generator, int, int], Image.Image]] = {
    "photo": photo,
    "document": document,
    "screenshot": screenshot,
    "chart": chart,
}


def accuracy_images(seed: int, per_kind: int, max_side: int | None = None) -> list[tuple[str, Image.Image]]:
    """(kind, RGB image) for `per_kind` images of each kind, drawn at their size, then scaled down (bicubic) to
    `max_side` when given (CPU runs)."""
    out = []
    for k, kind in enumerate(KINDS):
        width, height = SIZES[kind]
        for i in range(per_kind):
            image = DRAW[kind](image_rng(seed, k, i), width, height)
            if max_side is not None and max(width, height) > max_side:
                ratio = max_side / max(width, height)
                size = (max(28, round(width * ratio)), max(28, round(height * ratio)))
                image = image.resize(size, Image.Resampling.BICUBIC)
            out.append((kind, image))
    return out
