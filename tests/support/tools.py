"""The ``add`` tool the capture, gateway and OTel tests share, in the OpenAI and Anthropic shapes.

``examples/quickstart.py`` spells the same tool out itself: an example stays readable on its own.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ADD_PARAMETERS", "ADD_TOOL", "ANTHROPIC_ADD_TOOL"]

ADD_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
"""The tool's JSON Schema: two required integers ``a`` and ``b``."""

ADD_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "add", "description": "Add two integers.", "parameters": ADD_PARAMETERS},
}
"""``add`` as an OpenAI Chat Completions tool (what LangChain's ``convert_to_openai_tool`` gives for it too)."""

ANTHROPIC_ADD_TOOL: dict[str, Any] = {
    "name": "add",
    "description": "Add two integers.",
    "input_schema": ADD_PARAMETERS,
}
"""``add`` as an Anthropic Messages tool."""
