"""The exported policy as an MLflow pyfunc model: transformers answers each (image, prompt) greedily.

This file is the model's code, logged with MLflow's models-from-code (so nothing is pickled):
vlmgym.tracking.model_registry logs it with the exported transformers folder as the artifact `hf_model` and vlmgym's
source as code, so `mlflow.pyfunc.load_model("models:/vlmgym-<env>/1")` works where vlmgym is not installed
(transformers, torch and Pillow are its requirements). Prompts are formatted as the envs format them (one user
message: the images, then the text) and answered through the first end-of-turn token, as the evaluate stage's HF
baseline does, so the answers equal the JAX engine's greedy answers.

model.predict([{"image": jpeg_bytes, "prompt": "Where was this photo taken? ..."}]) # -> ["Country: ..."]

`image` is encoded image bytes, base64 text of them, or a PIL image (several images: a list; none: the column
left out or None); model_config `max_new_tokens` (the rollout stage's) bounds each answer, a `max_new_tokens`
predict param overrides it. The logged model's signature (signature()) says so: inputs `image` (binary, optional)
and `prompt` (string), one string per row out, the param `max_new_tokens` (long); its input example
(input_example()) is one tiny PNG with a prompt, which MLflow answers once when the model is logged.
"""

from __future__ import annotations

import base64
import io
import math
from typing import Any

import mlflow
from mlflow.models import ModelSignature
from mlflow.pyfunc import PythonModel
from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema
from mlflow.types.type_hints import TypeFromExample

ARTIFACT = "hf_model"
DEFAULT_MAX_NEW_TOKENS = 64
EXAMPLE_PROMPT = "What does this image show?"


def signature(max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> ModelSignature:
    """What predict takes and gives: rows of `image` (encoded bytes; base64 text in a JSON request to a served
    model; optional) and `prompt`, one answer string per row, and the `max_new_tokens` param (default: the
    model's)."""
    return ModelSignature(inputs=Schema([ColSpec("binary", "image", required=False), ColSpec("string", "prompt")]),
                          outputs=Schema([ColSpec("string")]),
                          params=ParamSchema([ParamSpec("max_new_tokens", "long", int(max_new_tokens))]))


def example_image() -> bytes:
    """A 32x32 PNG (a colour gradient): the input example's image, made here rather than read from anywhere."""
    from PIL import Image

    image = Image.new("RGB", (32, 32))
    image.putdata([(8 * x, 8 * y, 128) for y in range(32) for x in range(32)])
    encoded = io.BytesIO()
    image.save(encoded, format="PNG")
    return encoded.getvalue()


def input_example() -> list[dict]:
    """Rows as predict takes them: one tiny image with a prompt (MLflow answers it once when the model is logged,
    as a served model would, within the model's max_new_tokens)."""
    return [{"image": example_image(), "prompt": EXAMPLE_PROMPT}]


def _missing(value: Any) -> bool:
    """No image: None, or the NaN (pandas' NA) a DataFrame puts where a row left the column out."""
    return (value is None or (isinstance(value, float) and math.isnan(value))
            or type(value).__name__ == "NAType")


def _image(value: Any) -> Any:
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, Image.Image):
        return value
    if isinstance(value, str):
        value = value.encode("ascii", errors="replace")
    if not isinstance(value, bytes | bytearray):
        raise TypeError(f"image must be encoded bytes, base64 text or a PIL image, got {type(value).__name__}")
    try:
        with Image.open(io.BytesIO(value)) as image:
            return image.convert("RGB")
    except UnidentifiedImageError:
        pass
    # Base64 text, as str or as the bytes of it that a JSON request to a served model ({"inputs": ...}) gives.
    try:
        value = base64.b64decode(b"".join(bytes(value).split()), validate=True)
    except ValueError:
        raise ValueError("image is neither encoded image bytes nor base64 text of them") from None
    with Image.open(io.BytesIO(value)) as image:
        return image.convert("RGB")


def _rows(model_input: Any) -> list[dict]:
    if hasattr(model_input, "to_dict"):  # a pandas DataFrame, what pyfunc serving passes
        return model_input.to_dict("records")
    if isinstance(model_input, dict):
        return [model_input]
    return list(model_input)


def observation(row: dict) -> dict:
    """One input row as an env observation: its images and one user message (the images, then the prompt)."""
    if "prompt" not in row:
        raise KeyError(f"each input needs a 'prompt' (and usually an 'image'), got keys {sorted(row)}")
    images = row.get("image")
    images = images.tolist() if hasattr(images, "tolist") else images  # numpy, as a parsed JSON request has them
    images = [] if _missing(images) else images if isinstance(images, list | tuple) else [images]
    images = [_image(image) for image in images]
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": str(row["prompt"])}]
    return {"images": images, "messages": [{"role": "user", "content": content}]}


class GreedyAnswers(PythonModel):
    """transformers' greedy answers of the exported folder, decoded to text."""

    def load_context(self, context: Any) -> None:
        from vlmgym.models.qwen3_vl.hf_reference import load_hf_model
        from vlmgym.models.qwen3_vl.processor import Processor

        folder = context.artifacts[ARTIFACT]
        self.processor = Processor.from_pretrained(folder)
        self.model = load_hf_model(folder, "fp32")
        self.max_new_tokens = int((context.model_config or {}).get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS))

    # TypeFromExample: pyfunc checks the input against the logged signature(), then passes it as the input
    # example is, a list of row dicts (no hint at all makes MLflow warn at load).
    def predict(self, context, model_input: TypeFromExample, params=None) -> list[str]:
        from vlmgym.models.qwen3_vl.hf_reference import hf_greedy

        observations = [observation(row) for row in _rows(model_input)]
        max_new_tokens = int((params or {}).get("max_new_tokens", self.max_new_tokens))
        answers, _, _ = hf_greedy(self.model, self.processor, observations, max_new_tokens=max_new_tokens,
                                  batch_size=max(1, len(observations)), warm_up=False)
        return [self.processor.decode(answer) for answer in answers]


mlflow.models.set_model(GreedyAnswers())
