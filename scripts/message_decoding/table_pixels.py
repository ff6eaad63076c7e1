"""Are the decoder table's letters in the tiny model's 12 image tokens? A logistic regression on the raw patch rows
of generated tables (JPEG as the download stage writes them, preprocessed at the tiny budget, 128x96) predicts the
plain letter of single cells on held-out tables; no vision tower is involved, so this bounds what the tower can read.

    python scripts/message_decoding/table_pixels.py [--tables 3000] [--held-out 500]

Prints the train and held-out accuracy for the cells of coded a, e, n and z (chance: 1/26). Several minutes on two
cores (the regression over 73,728 pixel values)."""
import argparse
import io

import numpy as np
from PIL import Image
from sklearn.linear_model import LogisticRegression

from vlmgym.data import layout
from vlmgym.envs.message_decoding import data as md_data
from vlmgym.envs.message_decoding.render import render_table
from vlmgym.models.qwen3_vl.base_model import TINY_MAX_PIXELS, TINY_MIN_PIXELS
from vlmgym.models.qwen3_vl.processor import ImageSettings, preprocess_images

CELLS = "aenz"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=3000, help="tables generated (train split, seed 0)")
    parser.add_argument("--held-out", type=int, default=500, help="of those, the last this many are held out")
    args = parser.parse_args()
    settings = ImageSettings(min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS)
    rows, labels = [], []
    for index in range(args.tables):
        sample = md_data.generate_sample(0, "train", index, md_data.MessageDecodingDataParams())
        encoded = layout.encode_jpeg(render_table(sample.decoder, sample.columns, 256, 192))
        image = Image.open(io.BytesIO(encoded)).convert("RGB")
        rows.append(preprocess_images([image], settings=settings)[0].reshape(-1))
        labels.append([ord(letter) - ord("a") for letter in sample.decoder])
    pixels, labels = np.asarray(rows, np.float32), np.asarray(labels)
    cut = args.tables - args.held_out
    for cell in CELLS:
        head = ord(cell) - ord("a")
        fit = LogisticRegression(max_iter=300).fit(pixels[:cut], labels[:cut, head])
        print(f"cell {cell}: train {fit.score(pixels[:cut], labels[:cut, head]):.3f}, "
              f"held-out {fit.score(pixels[cut:], labels[cut:, head]):.3f}")


if __name__ == "__main__":
    main()
