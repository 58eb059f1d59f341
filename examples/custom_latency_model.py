"""A custom latency model, checked against the contract and used from a scenario
(docs/howto/add-a-latency-model.md)."""

import numpy as np

import servesim
from servesim.plugins import LatencyModel, as_float, check_keys, check_latency_model, register


@register("latency", "linear-context")
class LinearContext(LatencyModel):
    """Step time linear in prefill tokens, decode requests and the decoders' context (µs)."""

    name = "linear-context"
    PARAMS = {
        "base_us": 8000.0,
        "per_prefill_token_us": 40.0,
        "per_decode_us": 25.0,
        "per_context_token_us": 0.01,
        "queueing_us": 0.0,
        "output_token_us": 0.0,
    }

    def __init__(self, **params):
        self.params = {**self.PARAMS, **params}
        p = self.params
        self.base, self.per_prefill = p["base_us"], p["per_prefill_token_us"]
        self.per_decode, self.per_context = p["per_decode_us"], p["per_context_token_us"]
        self.queueing = int(p["queueing_us"])  # α0: instance arrival -> wait queue
        self.output_token_time_us = int(p["output_token_us"])  # α2: added to TTFT and each ITL

    def step_time_us(self, batch):
        t = (
            self.base
            + self.per_prefill * batch.prefill_tokens
            + self.per_decode * batch.decode_requests
            + self.per_context * batch.decode_context
        )
        return max(1, int(t))

    def queueing_time_us(self, prompt_tokens):
        return self.queueing

    def decode_steps_us(self, decode_requests, decode_context, k):
        # Optional closed form for the fast-forward: same arithmetic as step_time_us, vectorised.
        context = decode_context + np.arange(k, dtype=np.int64) * decode_requests
        t = (
            self.base
            + self.per_prefill * 0
            + self.per_decode * decode_requests
            + self.per_context * context
        )
        return np.maximum(t.astype(np.int64), 1)

    @classmethod
    def from_config(cls, params, ctx):
        # `ctx` holds the scenario's model, gpu and tp, should the model depend on them.
        check_keys(params, cls.PARAMS, ctx.path)
        return cls(**{k: as_float(v, f"{ctx.path}.{k}", minimum=0) for k, v in params.items()})

    def describe(self):
        return {"model": self.name, **self.params}


check_latency_model(LinearContext())  # raises AssertionError naming any broken property
check_latency_model(LinearContext(per_context_token_us=0.5, output_token_us=300))

scenario = servesim.load_scenario(
    {
        "latency": {"model": "linear-context", "per_context_token_us": 0.02},
        "workload": {"preset": "chatbot", "rate": 20, "requests": 300},
    }
)
results = servesim.simulate(scenario)
print("ITL p50 (ms):", round(results.summary["itl_p50_ms"], 2))
print("latency:", results.summary["scenario"]["latency"])
