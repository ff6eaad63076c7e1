"""The exported policy as an MLflow pyfunc model: transformers answers each (image, prompt) greedily.

This file is the model's code, logged with MLflow's models-from-code (so nothing is pickled):
vlmgym.tracking.model_registry logs it with the exported transformers folder as the artifact `hf_model` and vlmgym's
source as code, so `mlflow.pyfunc.load_model("models:/vlmgym-<env>/1")` works where vlmgym is not installed
(transformers, torch and Pillow are its requirements). Prompts are formatted as the envs format them (one user
message: the images, then the text) and answered through the first end-of-turn token, as the evaluate stage's HF
baseline does, so the answers equal the JAX engine's greedy answers.

model.predict([{"image": jpeg_bytes, "prompt": "Where was this photo taken? ..."}]) # -> ["Country: ..."]

`image` is encoded image bytes, base64 text of them, or a PIL image (several images: a list); model_config
`max_new_tokens` (the rollout stage's) bounds each answer, a `max_new_tokens` predict param overrides it.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import mlflow
from mlflow.pyfunc import PythonModel

ARTIFACT = "hf_model"
DEFAULT_MAX_NEW_TOKENS = 64


def _image(value: Any) -> Any:
    from PIL import Image

    if isinstance(value, Image.Image):
        return value
    if isinstance(value, str):
        value = base64.b64decode(value, validate=True)
    if not isinstance(value, bytes | bytearray):
        raise TypeError(f"image must be encoded bytes, base64 text or a PIL image, got {type(value).__name__}")
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
    images = [] if images is None else images if isinstance(images, list | tuple) else [images]
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

    # No type hints here: MLflow would read them as an input schema and warn that Any is not one.
    def predict(self, context, model_input, params=None):
        from vlmgym.models.qwen3_vl.hf_reference import hf_greedy

        observations = [observation(row) for row in _rows(model_input)]
        max_new_tokens = int((params or {}).get("max_new_tokens", self.max_new_tokens))
        answers, _, _ = hf_greedy(self.model, self.processor, observations, max_new_tokens=max_new_tokens,
                                  batch_size=max(1, len(observations)), warm_up=False)
        return [self.processor.decode(answer) for answer in answers]


mlflow.models.set_model(GreedyAnswers())
