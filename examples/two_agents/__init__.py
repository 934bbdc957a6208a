"""Two agents, each its own policy: a router and a calculator agent (``python -m examples.two_agents``)."""
