"""The engine room: time, ordering, randomness, plugins, configuration, errors.

Nothing in this subpackage knows what is being simulated: it is a generic discrete-event kit
(a test enforces it).
"""
