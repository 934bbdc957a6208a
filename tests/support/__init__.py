"""Shared test support: plain helpers, imported as ``tests.support.<module>`` (pytest's ``pythonpath``).

Fixtures live in ``tests/conftest.py``; everything a test imports from elsewhere lives here, so no test imports
another test module and no test edits ``sys.path``:

- ``synth``: synthetic episodes in the Parquet contract, ``WEATHER_TOOL`` and the CPU GRPO settings.
- ``tools``: the ``add`` tool schema the capture tests share.
- ``sessions``: stores written through the SDK and raw segment files (episode tests).
- ``gateway``: start and stop a gateway process; read and normalise its store.
- ``serve``: the tiny base model, LoRA adapters and admin credential of the policy-server tests.
- ``otel``: an OTel receiver process and a small store with tool calls and rewards.
- ``trained_once``: a server's token ids and the check that every generation is trained exactly once.
- ``segments``: raw store segment lines (the trainer's bad-input tests).
- ``resident``: the resident-trainer tests' config, versions and optimizer state.
- ``loop``: the loop tests' task files, lock-step and asynchronous configs, and run checks.
- ``main_job``: the main job's output filter.
- ``fake_openai``: OpenAI's fine-tuning API (files, jobs, events) as routes on ``sdk.testing``'s server.
- ``fake_vllm``: vLLM's adapter and weight-transfer routes on ``sdk.testing``'s server, in a process of its
  own (``VLLM``, the command line the launcher under test runs in the place of ``vllm``).

Every scripted HTTP fake is ``sdk.testing.ScriptedOpenAIServer``: inference replies from its queue or a
policy, broken streams as ``ScriptedResponse.raw``, any other API as ``routes``.
"""
