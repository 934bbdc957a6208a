"""Runnable examples. ``python -m examples.quickstart`` needs nothing but the core and openai."""
