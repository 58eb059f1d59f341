"""Measuring a real server the way the simulator predicts it (``servesim observe``).

The request stream is the one a simulation of the same workload would see (arrivals, sizes,
prefix groups, from :mod:`servesim.workloads`); prompts are built to those token counts
(:mod:`~servesim.observe.prompts`); each request is streamed and timed chunk by chunk
(:mod:`~servesim.observe.client`); the load is offered open or closed loop
(:mod:`~servesim.observe.load`); the run is written as a BLIS TraceV2 trace and the generic
measured-run CSV that ``servesim validate`` and ``servesim calibrate`` read
(:mod:`~servesim.observe.writers`). The HTTP client is httpx, the ``observe`` extra
(``pip install 'servesim[observe]'``); nothing here imports it until a run starts.
"""

from servesim.observe.client import Outcome
from servesim.observe.load import Observation, Observer, ObserveSettings, observe_requests
from servesim.observe.prompts import DEFAULT_WORDS_PER_TOKEN, PromptBuilder, load_tokenizer

__all__ = [
    "DEFAULT_WORDS_PER_TOKEN",
    "Observation",
    "ObserveSettings",
    "Observer",
    "Outcome",
    "PromptBuilder",
    "load_tokenizer",
    "observe_requests",
]
