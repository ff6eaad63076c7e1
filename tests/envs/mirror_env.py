"""A multi-turn plug-in env: the colour env of docs/writing-an-env.md with a tool of its own, `mirror`, beside
the built-in zoom. Its episodes take up to two turns: the policy may call a tool, sees the result, then answers."""

from __future__ import annotations

from dataclasses import dataclass

from colour_env import ColourEnv, ColourParams
from PIL import Image, ImageOps

from vlmgym.api import BUILTIN_TOOLS, Tool, ToolError, ToolParams, ToolResult, spec


class Mirror(Tool):
    """Mirror the image left to right. Takes no arguments."""

    name = "mirror"
    description = "Mirror the image left to right."
    parameters = {"type": "object", "properties": {}, "required": []}

    def run(self, arguments: dict, image: Image.Image) -> ToolResult:
        if arguments:  # the message is what the policy reads in its next turn
            raise ToolError(f"mirror takes no arguments, got {', '.join(sorted(map(str, arguments)))}")
        return ToolResult(text="mirror: the image flipped left to right", image=ImageOps.mirror(image.convert("RGB")))


@dataclass(frozen=True)
class MirrorColourParams(ColourParams, ToolParams):
    tools: tuple[str, ...] = spec(("mirror",), choices=("mirror", *BUILTIN_TOOLS), doc="tools the policy may call")
    max_turns: int = spec(2, ge=1, le=4, doc="policy turns per episode, the answer's included")


class MirrorColourEnv(ColourEnv):
    name = "mirror_colour"
    Params = MirrorColourParams
    tool_classes = {**BUILTIN_TOOLS, "mirror": Mirror}  # what env.mirror_colour.tools may name

    def ideal_tool_calls(self, meta: dict) -> list[dict]:
        """What SFT teaches before the answer: one look at the mirrored image."""
        return [{"name": "mirror", "arguments": {}}]
