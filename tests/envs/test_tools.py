"""Visual tools (vlmgym.envs.tools): parsing Qwen3-VL tool calls, zoom and rotate, the never-raise runner,
the tool message and how the chat template renders it, and a fuzz test."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from vlmgym.envs.tools import (
    BUILTIN_TOOLS,
    Rotate,
    Tool,
    ToolCall,
    ToolError,
    ToolOutcome,
    ToolResult,
    Zoom,
    make_tools,
    parse_tool_call,
    run_tool_call,
    tool_message,
)
from vlmgym.models.qwen3_vl.processor import render_chat

RED, GREEN, BLUE, WHITE = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255)
TOOLS = make_tools(["zoom", "rotate"])


def quadrants(width: int = 200, height: int = 100) -> Image.Image:
    """Top-left red, top-right green, bottom-left blue, bottom-right white."""
    image, w, h = Image.new("RGB", (width, height)), width // 2, height // 2
    for colour, box in ((RED, (0, 0, w, h)), (GREEN, (w, 0, width, h)), (BLUE, (0, h, w, height)),
                        (WHITE, (w, h, width, height))):
        image.paste(colour, box)
    return image


def colours(image: Image.Image) -> set[tuple[int, ...]]:
    return {tuple(int(c) for c in pixel) for pixel in np.asarray(image).reshape(-1, 3)}


def same(a: Image.Image, b: Image.Image) -> bool:
    return a.size == b.size and np.array_equal(np.asarray(a), np.asarray(b))


def call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


# --- parsing ----------------------------------------------------------------------------------------------------


def test_a_well_formed_call_inside_prose_parses_exactly():
    text = ('Let me look closer.\n<tool_call>\n  {"name": "zoom", "arguments": {"x1": 100, "y1": 200, "x2": 600, '
            '"y2": 700.5}}  \n\n</tool_call>\nthen I answer.')
    assert parse_tool_call(text) == ToolCall("zoom", {"x1": 100, "y1": 200, "x2": 600, "y2": 700.5})


def test_absent_arguments_are_empty_and_no_tag_is_an_answer():
    assert parse_tool_call('<tool_call>{"name": "rotate"}</tool_call>') == ToolCall("rotate", {})
    assert parse_tool_call("The answer is 7.") is None
    assert parse_tool_call("") is None
    assert parse_tool_call("a stray </tool_call> only") is None


@pytest.mark.parametrize("text, words", [
    ('<tool_call>{"name": "zoom", "arguments": {}}', "not closed"),
    ('<tool_call>{"name": "zoom"}</tool_call><tool_call>{"name": "zoom"}</tool_call>', "one tool call per turn"),
    ('<tool_call>{"name": "zoom", </tool_call>', "not valid JSON"),
    ("<tool_call></tool_call>", "not valid JSON"),
    ("<tool_call>" + "[" * 5000 + "</tool_call>", "at most 2000"),
    ("<tool_call>" + "[" * 1990 + "</tool_call>", "not valid JSON: nested too deeply"),
    ('<tool_call>["zoom", {}]</tool_call>', "not an array"),
    ("<tool_call>42</tool_call>", "not a number"),
    ("<tool_call>null</tool_call>", "not null"),
    ('<tool_call>{"arguments": {}}</tool_call>', 'string "name", got None'),
    ('<tool_call>{"name": 3, "arguments": {}}</tool_call>', 'string "name", got 3'),
    ('<tool_call>{"name": "zoom", "arguments": [1, 2]}</tool_call>', '"arguments" must be a JSON object, got [1, 2]'),
    ('<tool_call>{"name": "zoom", "arguments": "x1=3"}</tool_call>', "must be a JSON object, got 'x1=3'"),
])
def test_malformed_calls_raise_a_tool_error_naming_the_problem(text, words):
    with pytest.raises(ToolError) as error:
        parse_tool_call(text)
    assert words in str(error.value)


def test_huge_adversarial_text_is_rejected_quickly():
    # Many openings, or one opening and megabytes after it: linear work, a bounded message.
    with pytest.raises(ToolError, match="found 100000 tool calls"):
        parse_tool_call("<tool_call>" * 100_000)
    with pytest.raises(ToolError, match="not closed"):
        parse_tool_call("<tool_call>" + "{" * 1_000_000)
    with pytest.raises(ToolError) as error:
        parse_tool_call("<tool_call>" + '"' + "a" * 3_000_000 + '"</tool_call>')
    assert len(str(error.value)) < 200


# --- zoom -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("box, colour", [
    ((0, 0, 500, 500), RED), ((500, 0, 1000, 500), GREEN), ((0, 500, 500, 1000), BLUE), ((500, 500, 1000, 1000), WHITE),
    ((600, 600, 900, 900), WHITE), ((510, 100, 990, 400), GREEN),
])
def test_zoom_onto_a_quadrant_fills_the_source_size_with_its_colour(box, colour):
    arguments = dict(zip(("x1", "y1", "x2", "y2"), box))
    result = Zoom().run(arguments, quadrants())
    assert result.image.size == (200, 100) and result.image.mode == "RGB"
    assert colours(result.image) == {colour}
    assert result.box == tuple(float(value) for value in box) and all(type(v) is float for v in result.box)
    assert result.text == f"zoom ({', '.join(map(str, box))}): the region shown at full size"


def test_zoom_crops_the_pixel_box_rounded_from_the_coordinates():
    # A gradient image: each column's red channel is its x, so the zoom's first and last columns tell the crop.
    source = Image.new("RGB", (200, 100))
    source.putdata([(x, 0, 0) for _ in range(100) for x in range(200)])
    result = Zoom().run({"x1": 250, "y1": 0, "x2": 752, "y2": 1000}, source)  # x pixels round(50)..round(150.4)=150
    assert result.image.size == (200, 100)
    assert abs(result.image.getpixel((0, 50))[0] - 50) <= 1 and abs(result.image.getpixel((199, 50))[0] - 149) <= 1


def test_zoom_converts_other_modes_to_rgb():
    result = Zoom().run({"x1": 0, "y1": 0, "x2": 1000, "y2": 1000}, Image.new("L", (8, 6), 77))
    assert result.image.mode == "RGB" and result.image.size == (8, 6) and colours(result.image) == {(77, 77, 77)}


GOOD = {"x1": 100, "y1": 200, "x2": 600, "y2": 700}


@pytest.mark.parametrize("change, words", [
    ({"x2": None}, "missing x2"),
    ({"zoom": 2}, "unexpected 'zoom'"),
    ({"x1": True}, "x1 must be a finite number, got True"),
    ({"y1": "200"}, "y1 must be a finite number, got '200'"),
    ({"y2": float("nan")}, "y2 must be a finite number, got nan"),
    ({"x2": float("inf")}, "x2 must be a finite number, got inf"),
    ({"x1": [1]}, "x1 must be a finite number"),
    ({"x1": 500, "x2": 40}, "x2 (40) must be greater than x1 (500)"),
    ({"y1": 700}, "y2 (700) must be greater than y1 (700)"),
    ({"x1": -1}, "x1 (-1) must be between 0 and 1000"),
    ({"y2": 1000.5}, "y2 (1000.5) must be between 0 and 1000"),
    ({"x2": 10 ** 500}, "x2 (1000000000000000000000000000000000000000..."),
])
def test_invalid_zoom_arguments_raise_naming_the_argument(change, words):
    arguments = {key: value for key, value in {**GOOD, **change}.items() if value is not None}
    with pytest.raises(ToolError) as error:
        Zoom().run(arguments, quadrants())
    assert words in str(error.value) and str(error.value).startswith("zoom: ")


def test_a_sub_pixel_zoom_box_is_an_error():
    with pytest.raises(ToolError, match="less than one pixel of the 4x4 image"):
        Zoom().run({"x1": 0, "y1": 0, "x2": 100, "y2": 1000}, Image.new("RGB", (4, 4)))  # round(0.4) == 0 wide
    assert Zoom().run({"x1": 0, "y1": 0, "x2": 130, "y2": 1000}, Image.new("RGB", (4, 4))).image.size == (4, 4)


# --- rotate -----------------------------------------------------------------------------------------------------


def test_rotate_90_is_counter_clockwise_with_expand():
    source = quadrants()
    source.putpixel((0, 0), (1, 2, 3))  # the top-left corner goes to the bottom-left when turned counter-clockwise
    result = Rotate().run({"degrees": 90}, source)
    assert result.image.size == (100, 200) and result.box is None
    assert result.image.getpixel((0, 199)) == (1, 2, 3)
    assert result.image.getpixel((0, 0)) == GREEN  # the top-right quadrant is now at the top-left
    assert same(result.image, source.rotate(90, expand=True))
    for degrees in (180, 270, 270.0):
        assert same(Rotate().run({"degrees": degrees}, source).image, source.rotate(degrees, expand=True))


@pytest.mark.parametrize("arguments, words", [
    ({"degrees": 45}, "must be 90, 180 or 270, got 45"),
    ({"degrees": -90}, "got -90"),
    ({"degrees": 360}, "got 360"),
    ({"degrees": "90"}, "finite number, got '90'"),
    ({"degrees": True}, "finite number, got True"),
    ({}, "missing degrees"),
    ({"degrees": 90, "clockwise": True}, "unexpected 'clockwise'"),
])
def test_bad_rotations_raise(arguments, words):
    with pytest.raises(ToolError) as error:
        Rotate().run(arguments, quadrants())
    assert words in str(error.value)


# --- schema, registry -------------------------------------------------------------------------------------------


def test_zoom_schema_is_the_function_format():
    schema = Zoom().schema()
    assert schema == {"type": "function", "function": {
        "name": "zoom", "description": Zoom.description,
        "parameters": {"type": "object", "required": ["x1", "y1", "x2", "y2"], "properties": {
            key: {"type": "number", "description": f"{side}: relative coordinate, 0 = left/top edge, "
                                                   "1000 = right/bottom edge"}
            for key, side in (("x1", "left"), ("y1", "top"), ("x2", "right"), ("y2", "bottom"))}}}}
    schema["function"]["parameters"]["required"].append("mutated")
    assert Zoom().schema()["function"]["parameters"]["required"] == ["x1", "y1", "x2", "y2"]
    assert Rotate().schema()["function"]["parameters"]["properties"]["degrees"]["enum"] == [90, 180, 270]


def test_make_tools():
    assert [type(tool) for tool in make_tools(["rotate", "zoom"])] == [Rotate, Zoom]
    assert set(BUILTIN_TOOLS) == {"zoom", "rotate"}
    with pytest.raises(ValueError, match="unknown tool 'crop'; known: zoom, rotate"):
        make_tools(["zoom", "crop"])
    with pytest.raises(ValueError, match="repeat"):
        make_tools(["zoom", "zoom"])


# --- run_tool_call, tool_message --------------------------------------------------------------------------------


class Broken(Tool):
    name = "broken"
    description = "always fails"
    parameters = {"type": "object", "properties": {}}

    def run(self, arguments, image):
        raise OSError("decoder exploded")


def test_run_tool_call_outcomes():
    image = quadrants()
    answer = run_tool_call(TOOLS, "It is red.", image)
    assert answer == ToolOutcome(None, None, None) and answer.kind == "answer"

    ok = run_tool_call(TOOLS, "Closer.\n" + call("zoom", {"x1": 0, "y1": 0, "x2": 500, "y2": 500}), image)
    assert ok.kind == "ok" and ok.call == ToolCall("zoom", {"x1": 0, "y1": 0, "x2": 500, "y2": 500})
    assert colours(ok.result.image) == {RED} and ok.result.box == (0.0, 0.0, 500.0, 500.0)

    unknown = run_tool_call(TOOLS, call("crop", {}), image)
    assert unknown.kind == "error" and unknown.error == "unknown tool 'crop'; available: zoom, rotate"
    assert unknown.call == ToolCall("crop", {}) and unknown.result is None

    bad = run_tool_call(TOOLS, call("zoom", {"x1": 500, "y1": 0, "x2": 40, "y2": 10}), image)
    assert bad.error == "zoom: x2 (40) must be greater than x1 (500)"

    broken = run_tool_call([Broken()], call("broken", {}), image)
    assert broken.kind == "error" and broken.error == "tool broken failed: OSError"
    assert run_tool_call(TOOLS, call("zoom", GOOD), None).error == "tool zoom failed: AttributeError"

    unparsable = run_tool_call(TOOLS, "<tool_call>{oops}</tool_call>", image)
    assert unparsable.kind == "error" and unparsable.call is None and "not valid JSON" in unparsable.error
    assert run_tool_call(TOOLS, None, image).error == "the turn must be text, got NoneType"
    assert run_tool_call((), call("zoom", GOOD), image).error == "unknown tool 'zoom'; available: none"


def test_tool_messages():
    ok = ToolOutcome(ToolCall("zoom", GOOD), ToolResult("zoomed", Image.new("RGB", (2, 2))), None)
    assert tool_message(ok) == {"role": "tool", "content": [{"type": "image"}, {"type": "text", "text": "zoomed"}]}
    text_only = ToolOutcome(ToolCall("x", {}), ToolResult("done", None), None)
    assert tool_message(text_only) == {"role": "tool", "content": [{"type": "text", "text": "done"}]}
    error = ToolOutcome(None, None, "found 2 tool calls; make one tool call per turn")
    assert tool_message(error) == {"role": "tool", "content": [
        {"type": "text", "text": "error: found 2 tool calls; make one tool call per turn"}]}
    with pytest.raises(ValueError, match="answer"):
        tool_message(ToolOutcome(None, None, None))


def test_the_chat_template_renders_the_tool_image_as_a_tool_response():
    text = "Let me look closer.\n" + call("zoom", GOOD)
    outcome = run_tool_call(TOOLS, text, quadrants())
    rendered = render_chat([
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is the top left?"}]},
        {"role": "assistant", "content": text},
        tool_message(outcome),
    ])
    assert ("<|im_start|>user\n<tool_response>\n<|vision_start|><|image_pad|><|vision_end|>"
            "zoom (100, 200, 600, 700): the region shown at full size\n</tool_response><|im_end|>\n") in rendered
    assert rendered.count("<|image_pad|>") == 2 and rendered.endswith("<|im_start|>assistant\n")


# --- fuzz -------------------------------------------------------------------------------------------------------


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20)
NUMBER = st.integers(-50, 1050) | st.floats() | st.booleans() | st.text(max_size=4) | st.none() | st.integers()
ZOOM_ARGUMENTS = st.dictionaries(st.sampled_from(["x1", "y1", "x2", "y2", "z"]), NUMBER, max_size=5)
ROTATE_ARGUMENTS = st.dictionaries(st.sampled_from(["degrees", "x"]),
                                   st.sampled_from([0, 90, 180, 270, 90.0, -90, "90", True]) | NUMBER, max_size=2)
TEXTS = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(["<tool_call>", "</tool_call>", "{", "}", '"', "name", ":", "\n", " "]),
             max_size=30).map("".join),
    JSON.map(lambda value: f"<tool_call>{json.dumps(value)}</tool_call>"),
    st.builds(call, st.sampled_from(["zoom", "rotate", "crop", ""]), JSON),
    ZOOM_ARGUMENTS.map(lambda arguments: call("zoom", arguments)),
    st.fixed_dictionaries({key: st.integers(0, 1000) | st.floats(0, 1000) for key in ("x1", "y1", "x2", "y2")})
    .map(lambda arguments: call("zoom", arguments)),  # in range: about a quarter in order, down to sub-pixel boxes
    ROTATE_ARGUMENTS.map(lambda arguments: call("rotate", arguments)),
    st.sampled_from([90, 180, 270, 90.0]).map(lambda degrees: call("rotate", {"degrees": degrees})),
)
SMALL = quadrants(12, 8)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXTS)
def test_run_tool_call_never_raises(text):
    outcome = run_tool_call(TOOLS, text, SMALL)
    assert outcome.kind in ("answer", "ok", "error")
    if outcome.kind == "error":
        assert isinstance(outcome.error, str) and outcome.error and outcome.result is None
        assert tool_message(outcome)["content"][0]["text"].startswith("error: ")
    elif outcome.kind == "ok":
        assert outcome.result.image is not None and outcome.result.image.mode == "RGB"
        if outcome.call.name == "zoom":
            assert outcome.result.image.size == SMALL.size
            assert all(0 <= value <= 1000 and math.isfinite(value) for value in outcome.result.box)
        else:
            assert outcome.result.image.size in (SMALL.size, SMALL.size[::-1])
    else:
        assert "<tool_call>" not in text
