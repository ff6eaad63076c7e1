"""Episodes of several turns with visual tools (vlmgym.envs.tools), an option of every env whose settings have the
fields of ToolParams:

    env:
      digits:
        tools: [zoom]
        max_turns: 3

The prompt lists the tools in its system turn (Qwen3-VL's chat template; `list_tools: false` leaves them out) and
says how many calls the episode allows. Each policy turn with one tool call gets the tool's result back (a new
image: the zoomed region at the image's full size) and the episode goes on; a turn without a call is the answer,
scored as in a one-turn episode. A bad call (unparseable, unknown tool, out-of-range box) gets the error as the
tool's reply, so the policy can try again; it never raises. The last turn is always scored as the answer, a call in
it included (which the env's scorer pays nothing for), and so is a turn that cannot continue a conversation (cut at
the length budget, or holding a vision token). Tools work on the sample's first image, in its coordinates, whatever
was shown since.

The episode's reward is the final answer's plus the env's per-turn shaping (`Env.turn_reward` of each call, 0 by
default), which the final step returns whole (its info keeps the answer's alone as `answer_reward`); an
intermediate step returns its call's shaping and `done=False`. The state carries the conversation so far
(`extra["conversation"]`, an observation), the turn, and the calls made, which the final step's info reports:
`turns`, `tool_calls` (each with its tool, whether it ran, the error, the zoom box and its shaping reward) and
`tool_errors`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from vlmgym.config.spec import ParamsError, spec
from vlmgym.envs.tools import BUILTIN_TOOLS, Tool, make_tools, run_tool_call, tool_message
from vlmgym.models.qwen3_vl.chat import TOKEN_IDS, continues_conversation

# The functions below take the Env and its State (vlmgym.envs.base), which imports this module: typed Any.
MAX_TURNS = 8
CONVERSATION, TURN, CALLS = "conversation", "turn", "tool_calls"  # keys of a multi-turn State's extra


@dataclass(frozen=True)
class ToolParams:
    """The multi-turn option: tools the policy may call before it answers, and the turns an episode may take."""

    tools: tuple[str, ...] = spec((), choices=tuple(BUILTIN_TOOLS),
                                  doc="visual tools the policy may call before answering (zoom, rotate); "
                                      "empty: one-turn episodes")
    max_turns: int = spec(1, ge=1, le=MAX_TURNS, doc="with tools: policy turns per episode, the answer's included "
                                                     "(2 or more)")
    list_tools: bool = spec(True, doc="list the tools' JSON schemas in the system turn, as Qwen3-VL's chat template "
                                      "does (a model trained from scratch learns its calls from SFT instead, with a "
                                      "much shorter prompt)")

    def __post_init__(self) -> None:
        check_turns(tuple(self.tools), self.max_turns)


def check_turns(names: tuple[str, ...], turns: int, section: str = "") -> None:
    """Tools need a second turn, and a second turn needs tools."""
    if names and turns < 2:
        raise ParamsError(f"{section}tools {list(names)} need {section}max_turns >= 2 (a call, then the answer); "
                          f"it is {turns}")
    if turns > 1 and not names:
        raise ParamsError(f"{section}max_turns is {turns} but {section}tools is empty: an episode goes on only "
                          "after a tool call")


def tools_of(env: Any) -> tuple[Tool, ...]:
    """The env's tools from its settings (any Params with ToolParams' fields) and its `tool_classes`, checked
    against max_turns."""
    names, turns = tuple(getattr(env.params, "tools", ()) or ()), int(getattr(env.params, "max_turns", 1))
    check_turns(names, turns, f"env.{env.name}.")
    return make_tools(names, env.tool_classes)


def instruction(tools: tuple[Tool, ...], max_turns: int) -> str:
    """What the question adds about the tools (their schemas are in the system turn)."""
    names = " or ".join(tool.name for tool in tools)
    calls = "once" if max_turns == 2 else f"up to {max_turns - 1} times"
    return f"You may call {names} {calls} before you answer."


def begin(state: Any, observation: dict, tools: tuple[Tool, ...], listed: bool = True) -> tuple[Any, dict]:
    """The first turn's state and observation: the tools listed (when `listed`), the conversation kept in the
    state."""
    if listed:
        observation = {**observation, "tools": [tool.schema() for tool in tools]}
    return replace(state, extra={**state.extra, CONVERSATION: observation, TURN: 0, CALLS: []}), observation


def take_turn(env: Any, state: Any, text: str, token_ids: list[int] | None) -> tuple[Any, Any, float, bool, dict]:
    """One policy turn of a multi-turn episode: run its tool call and go on, or score it as the answer."""
    turn, calls = int(state.extra[TURN]), list(state.extra[CALLS])
    conversation = state.extra[CONVERSATION]
    last = turn + 1 >= env.max_turns
    cannot_go_on = token_ids is not None and not continues_conversation(env.tokenizer, token_ids)
    outcome = None if last or cannot_go_on else run_tool_call(env.tools, text, conversation["images"][0])
    if outcome is None or outcome.kind == "answer":
        done, _, reward, finished, info = env.score_answer(state, text)
        shaping = sum(call["reward"] for call in calls)
        return done, [], reward + shaping, finished, {**info, **_summary(calls, turn + 1, text, last),
                                                      "answer_reward": reward}
    call = {"turn": turn, "tool": outcome.call.name if outcome.call else None, "ok": outcome.kind == "ok",
            "error": outcome.error, "box": list(outcome.result.box) if outcome.kind == "ok" and outcome.result.box
            else None}
    call["reward"] = float(env.turn_reward(call))
    assistant = {"role": "assistant", "content": text}
    if token_ids is not None:
        assistant[TOKEN_IDS] = [int(i) for i in token_ids]
    image = outcome.result.image if outcome.kind == "ok" else None
    reply = {**conversation, "images": [*conversation["images"], *([image] if image is not None else [])],
             "messages": [*conversation["messages"], assistant, tool_message(outcome)]}
    extra = {**state.extra, CONVERSATION: reply, TURN: turn + 1, CALLS: [*calls, call]}
    return replace(state, extra=extra), reply, call["reward"], False, {"tool_call": call}


def _summary(calls: list[dict], turns: int, text: str, last: bool) -> dict:
    """The final step's account of the episode's tool use."""
    out = {"turns": turns, "tool_calls": calls, "tool_errors": sum(not c["ok"] for c in calls)}
    if last and isinstance(text, str) and "<tool_call>" in text:
        out["tool_call_after_last_turn"] = True  # scored as the answer it is not
    return out


def call_text(name: str, arguments: dict) -> str:
    """A tool call as Qwen3-VL writes one (its chat template's rendering of a call)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n</tool_call>"


def sft_turns(env: Any, state: Any, observation: dict) -> list[tuple[dict, str]]:
    """What SFT teaches for one sample, as (observation, target) per policy turn: each of the env's ideal tool
    calls in the conversation so far (the tool run on it, as in an episode), then the answer."""
    calls = env.ideal_tool_calls(state.meta) if env.max_turns > 1 else []
    # RuntimeError, not ValueError: SFT skips a sample whose target is too long (a ValueError), not a broken env
    if len(calls) > env.max_turns - 1:
        raise RuntimeError(f"env {env.name!r}: an ideal episode makes {len(calls)} tool calls, more than "
                         f"max_turns {env.max_turns} leaves before the answer")
    turns = []
    for call in calls:
        text = call_text(call["name"], call["arguments"])
        turns.append((observation, text))
        state, observation, _, done, info = env.step_text(state, text)
        if done or not info["tool_call"]["ok"]:
            raise RuntimeError(f"env {env.name!r}: its ideal call {text!r} for sample {state.key} did not run: "
                             f"{info.get('tool_call', {}).get('error')}")
    return [*turns, (observation, env.sft_target(state.meta))]
