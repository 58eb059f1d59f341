"""How the ``servesim`` console script starts: no cyclic garbage collection until start-up is over.

Start-up (imports, the scenario, the cluster) creates ~35k objects that live as long as the
process and almost no garbage, yet its allocations trigger ~90 collections of the young
generations (~0.01 s of a 0.2 s tiny run), and the interpreter's exit walks them all once more.
:func:`servesim.cli.run_main` pauses the collector; :func:`end_of_startup` freezes what start-up
built and turns it back on (docs/explanation/performance.md, "Start-up").
"""

from __future__ import annotations

import gc

_gc_paused = False
"""Whether :func:`pause_gc_for_startup` turned the cyclic garbage collector off."""


def pause_gc_for_startup() -> None:
    """Turn the collector off until :func:`end_of_startup` (the module docstring says why).
    The console script's entry only: ``main()`` called from Python leaves the caller's
    collector alone, and a collector the caller turned off stays off."""
    global _gc_paused
    if gc.isenabled():
        gc.disable()
        _gc_paused = True


def end_of_startup() -> None:
    """Turn the collector back on (if start-up turned it off), first moving what start-up
    built (modules, classes, the scenario) to the permanent generation with :func:`gc.freeze`,
    where later collections do not scan it again: it lives as long as the process."""
    global _gc_paused
    if _gc_paused:
        _gc_paused = False
        gc.freeze()
        gc.enable()
