"""Agent runs: tool calls extracted from message histories and traces, and what scores them.

``extract`` reads a run (pure functions, no Django); ``scoring`` holds the agent score's formulas;
``matching`` compares a run's tool calls with a reference trajectory. The kinds themselves, and
the settings they share (``kinds/agent_base.py``), live in ``evaluators/kinds/``.
"""
