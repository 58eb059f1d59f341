"""The engine room: time, ordering, randomness, plugins, configuration, auditing.

Nothing in this subpackage knows about LLMs (a test enforces it).
"""
