"""Framework integrations: one module per framework, each importing its framework lazily.

- ``integrations.openai``: the raw OpenAI client (chat completions, Responses; sync, async, streaming)
- ``integrations.langchain``: LangChain / LangGraph callback handler
- ``integrations.llama_index``: LlamaIndex instrumentation handlers
- ``integrations.strands``: Strands Agents hook provider

Each also has the recipe that points the framework's model at the policy server the loop and
``tracerl rollout`` name (``TRACERL_POLICY_BASE_URL`` / ``TRACERL_POLICY_MODEL``), sampling at temperature 1.0
with a timeout that fits a local server and recording each call with the server's token ids:
``openai.policy_client()``, ``langchain.policy_chat_model()``, ``llama_index.policy_llm()``,
``strands.policy_model()``.

Importing this package imports no framework.
"""
