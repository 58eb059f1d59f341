"""The engine room: time, ordering, randomness, plugins, configuration, errors.

Nothing in this subpackage knows about LLMs (a test enforces it).
"""
