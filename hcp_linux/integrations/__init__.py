"""hcp-linux as the sandbox of agent frameworks: the one sandbox per sample or agent session
they ask for (box), and the adapters that speak each framework's contract (inspect: Inspect
AI's ``SandboxEnvironment``; openai_agents: the OpenAI Agents SDK's ``BaseSandboxClient``).

Each adapter imports its framework and nothing else in hcp_linux imports an adapter, so
``import hcp_linux`` never loads a framework. docs/frameworks.md says what each maps to what.

May import: everything of hcp_linux's public API (Policy, Sandbox, Session, the jails).
"""
