"""Framework integrations: one module per framework, each importing its framework lazily.

- ``integrations.openai``: the raw OpenAI client (chat completions, Responses; sync, async, streaming)
- ``integrations.langchain``: LangChain / LangGraph callback handler
- ``integrations.llama_index``: LlamaIndex instrumentation handlers
- ``integrations.strands``: Strands Agents hook provider

Importing this package imports no framework.
"""
