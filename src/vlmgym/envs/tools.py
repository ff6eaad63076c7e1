"""Visual tools a multi-turn env offers its policy, in Qwen3-VL's tool-call format.

The policy calls a tool by writing, anywhere in its turn, exactly one block

    <tool_call>
    {"name": "zoom", "arguments": {"x1": 100, "y1": 200, "x2": 600, "y2": 700}}
    </tool_call>

and the env answers with a `tool` message (`tool_message`), which the chat template renders as a user turn holding
`<tool_response>` with the new image. A turn without `<tool_call>` is the final answer. Coordinates are Qwen3-VL's
relative ones: 0 is the left/top edge of the image and 1000 the right/bottom edge. The tools advertise themselves
through `Tool.schema()`, the OpenAI/Qwen function format that the chat template's `tools` list renders.

Contract: `run_tool_call` never raises on what a model wrote. Every failure, from malformed JSON to a crash inside a
tool, comes back as an "error" outcome whose message the policy reads in the next turn, so each `ToolError` says
what was wrong and what is expected; an exception would instead end a rollout over one bad sample.
"""

from __future__ import annotations

import abc
import copy
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from PIL import Image

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_CALL_CHARS = 2000  # a real call is ~100 characters; the cap bounds the parser's work on adversarial text
_JSON_KINDS = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string",
               list: "an array"}


class ToolError(ValueError):
    """A bad tool call; the message is shown to the policy, so it names the problem and what is expected."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class ToolResult:
    text: str
    image: Image.Image | None
    box: tuple[float, float, float, float] | None = None  # the 0-1000 region a zoom showed, for a report to draw


@dataclass(frozen=True)
class ToolOutcome:
    call: ToolCall | None
    result: ToolResult | None
    error: str | None

    @property
    def kind(self) -> str:
        """One of "answer" (the turn has no tool call), "ok" or "error"."""
        if self.error is not None:
            return "error"
        return "ok" if self.result is not None else "answer"


def _show(value, limit: int = 40) -> str:
    # Echo the model's own values back, but bounded: a 1,999-digit number must not flood the conversation.
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def parse_tool_call(text: str) -> ToolCall | None:
    """The one tool call in a turn, or None when the turn has no `<tool_call>` (a final answer)."""
    # Plain substring search, no regex: linear time on any input.
    count = text.count(OPEN)
    if count == 0:
        return None
    if count > 1:
        raise ToolError(f"found {count} tool calls; make one tool call per turn")
    start = text.index(OPEN) + len(OPEN)
    end = text.find(CLOSE, start)
    if end < 0:
        raise ToolError(f"{OPEN} is not closed; end the call with {CLOSE}")
    body = text[start:end].strip()
    if len(body) > MAX_CALL_CHARS:
        raise ToolError(f"tool call is {len(body)} characters long; at most {MAX_CALL_CHARS} are read")
    try:
        call = json.loads(body)
    except json.JSONDecodeError as error:
        raise ToolError(f"tool call is not valid JSON: {error.msg} (line {error.lineno} column {error.colno}); "
                        'expected {"name": ..., "arguments": {...}}') from None
    except RecursionError:  # nesting deep enough to exhaust the decoder's stack
        raise ToolError("tool call is not valid JSON: nested too deeply") from None
    if not isinstance(call, dict):
        raise ToolError('tool call must be a JSON object {"name": ..., "arguments": {...}}, '
                        f"not {_JSON_KINDS[type(call)]}")
    name = call.get("name")
    if not isinstance(name, str):
        raise ToolError(f'tool call needs a string "name", got {_show(name)}')
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        raise ToolError(f'tool call "arguments" must be a JSON object, got {_show(arguments)}')
    return ToolCall(name=name, arguments=arguments)


class Tool(abc.ABC):
    """A tool on the episode's image: its schema for the prompt and `run`, which raises ToolError on bad arguments."""

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict]  # JSON schema of the arguments

    def schema(self) -> dict:
        """The OpenAI/Qwen function entry that the chat template's `tools` list renders."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": copy.deepcopy(self.parameters)}}

    @abc.abstractmethod
    def run(self, arguments: dict, image: Image.Image) -> ToolResult: ...

    def corpus(self) -> list[str]:
        """Texts a tokenizer trained for this tool should cover: its calls and replies (default: its schema)."""
        return [json.dumps(self.schema())]

    def _check_keys(self, arguments: dict, expected: Sequence[str]) -> None:
        missing = [key for key in expected if key not in arguments]
        extra = [_show(key) for key in arguments if key not in expected]
        if missing or extra:
            found = [f"missing {', '.join(missing)}"] * bool(missing) + [
                f"unexpected {', '.join(extra[:5])}{', ...' * (len(extra) > 5)}"] * bool(extra)
            raise ToolError(f"{self.name}: {'; '.join(found)}; expected arguments {', '.join(expected)}")

    def _number(self, arguments: dict, key: str, high: int | None = None) -> int | float:
        value = arguments[key]
        # bool is an int in Python, but `true` is no coordinate; big ints are compared exactly, never made floats.
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                isinstance(value, float) and not math.isfinite(value)):
            raise ToolError(f"{self.name}: {key} must be a finite number, got {_show(value)}")
        if high is not None and not 0 <= value <= high:
            raise ToolError(f"{self.name}: {key} ({_show(value)}) must be between 0 and {high}")
        return value


_COORD = "relative coordinate, 0 = left/top edge, 1000 = right/bottom edge"


class Zoom(Tool):
    name = "zoom"
    description = ("Zoom into a rectangular region of the image. Coordinates are relative, from 0 to 1000; the "
                   "region is shown at the full image size.")
    parameters = {"type": "object",
                  "properties": {key: {"type": "number", "description": f"{side}: {_COORD}"}
                                 for key, side in (("x1", "left"), ("y1", "top"), ("x2", "right"), ("y2", "bottom"))},
                  "required": ["x1", "y1", "x2", "y2"]}

    def run(self, arguments: dict, image: Image.Image) -> ToolResult:
        self._check_keys(arguments, ("x1", "y1", "x2", "y2"))
        x1, y1, x2, y2 = (self._number(arguments, key, high=1000) for key in ("x1", "y1", "x2", "y2"))
        for low, high, a, b in (("x1", "x2", x1, x2), ("y1", "y2", y1, y2)):
            if not a < b:
                raise ToolError(f"zoom: {high} ({_show(b)}) must be greater than {low} ({_show(a)})")
        width, height = image.size
        pixels = (round(x1 / 1000 * width), round(y1 / 1000 * height),
                  round(x2 / 1000 * width), round(y2 / 1000 * height))
        if pixels[2] - pixels[0] < 1 or pixels[3] - pixels[1] < 1:
            raise ToolError(f"zoom: the box covers less than one pixel of the {width}x{height} image; widen it")
        # Back to the source's own size so the processor spends the same image tokens on it: same budget, more detail.
        zoomed = image.convert("RGB").crop(pixels).resize((width, height), Image.Resampling.BICUBIC)
        shown = ", ".join(_show(value) for value in (x1, y1, x2, y2))
        return ToolResult(text=f"zoom ({shown}): the region shown at full size", image=zoomed,
                          box=(float(x1), float(y1), float(x2), float(y2)))


    def corpus(self) -> list[str]:
        """Calls and replies over a deterministic spread of boxes, so every coordinate's digits are seen."""
        texts = [json.dumps(self.schema())]
        for start in range(0, 1000, 7):
            box = {"x1": start % 500, "y1": (start * 3) % 500, "x2": 500 + start % 500, "y2": 500 + (start * 7) % 500}
            texts.append(f'{OPEN}\n{json.dumps({"name": self.name, "arguments": box})}\n{CLOSE}')
            texts.append(f"zoom ({box['x1']}, {box['y1']}, {box['x2']}, {box['y2']}): the region shown at full size")
        return texts


class Rotate(Tool):
    name = "rotate"
    description = "Rotate the image counter-clockwise by 90, 180 or 270 degrees."
    parameters = {"type": "object",
                  "properties": {"degrees": {"type": "integer", "enum": [90, 180, 270],
                                             "description": "counter-clockwise rotation in degrees"}},
                  "required": ["degrees"]}
    _TRANSPOSE: ClassVar[dict] = {90: Image.Transpose.ROTATE_90, 180: Image.Transpose.ROTATE_180,
                                  270: Image.Transpose.ROTATE_270}

    def run(self, arguments: dict, image: Image.Image) -> ToolResult:
        self._check_keys(arguments, ("degrees",))
        degrees = self._number(arguments, "degrees")
        if degrees not in self._TRANSPOSE:  # 90.0 is accepted: JSON does not tell it from 90
            raise ToolError(f"rotate: degrees must be 90, 180 or 270, got {_show(degrees)}")
        degrees = int(degrees)
        # A transpose is exact and equals Image.rotate(degrees, expand=True) for right angles.
        rotated = image.convert("RGB").transpose(self._TRANSPOSE[degrees])
        return ToolResult(text=f"rotate ({degrees}): the image turned {degrees} degrees counter-clockwise",
                          image=rotated)


BUILTIN_TOOLS: dict[str, type[Tool]] = {"zoom": Zoom, "rotate": Rotate}


def make_tools(names: Sequence[str], catalogue: Mapping[str, type[Tool]] | None = None) -> tuple[Tool, ...]:
    """Instances of the named tools, in the given order, from `catalogue` (default: the built-in ones)."""
    catalogue = BUILTIN_TOOLS if catalogue is None else catalogue
    if unknown := [name for name in names if name not in catalogue]:
        raise ValueError(f"unknown tool {unknown[0]!r}; known: {', '.join(catalogue)}")
    if len(set(names)) != len(names):
        raise ValueError(f"tool names repeat: {list(names)}")
    return tuple(catalogue[name]() for name in names)


def run_tool_call(tools: Sequence[Tool], text: str, image: Image.Image) -> ToolOutcome:
    """Parse the turn and run its tool call on image; never raises on the model's text (see the module docstring)."""
    if not isinstance(text, str):
        return ToolOutcome(call=None, result=None, error=f"the turn must be text, got {type(text).__name__}")
    try:
        call = parse_tool_call(text)
    except ToolError as error:
        return ToolOutcome(call=None, result=None, error=str(error))
    if call is None:
        return ToolOutcome(call=None, result=None, error=None)
    by_name = {tool.name: tool for tool in tools}
    if call.name not in by_name:
        available = ", ".join(by_name) or "none"
        return ToolOutcome(call=call, result=None, error=f"unknown tool {_show(call.name)}; available: {available}")
    try:
        result = by_name[call.name].run(call.arguments, image)
    except ToolError as error:
        return ToolOutcome(call=call, result=None, error=str(error))
    except Exception as error:  # a crash inside a tool (a PIL error, say) must not end the rollout either
        return ToolOutcome(call=call, result=None, error=f"tool {call.name} failed: {type(error).__name__}")
    return ToolOutcome(call=call, result=result, error=None)


def tool_message(outcome: ToolOutcome) -> dict:
    """The HF-style `tool` chat message answering a tool call; the image part's pixels are the result's image."""
    if outcome.kind == "answer":
        raise ValueError("an answer turn gets no tool message: the episode ends there")
    if outcome.kind == "error":
        return {"role": "tool", "content": [{"type": "text", "text": "error: " + outcome.error}]}
    image = [{"type": "image"}] if outcome.result.image is not None else []
    return {"role": "tool", "content": [*image, {"type": "text", "text": outcome.result.text}]}


def tool_corpus(names: Sequence[str], catalogue: Mapping[str, type[Tool]] | None = None) -> list[str]:
    """The tokenizer texts of the named tools from `catalogue` (default: the built-in ones; an env passes its
    `tool_classes`), with the tool reply's tags; no names, no texts."""
    if not names:
        return []
    return ["<tool_response>\n</tool_response>",
            *[text for tool in make_tools(names, catalogue) for text in tool.corpus()]]
