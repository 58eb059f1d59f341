"""Tensor-parallel checks: which ``tp`` sizes split a model's attention heads (vLLM's rule)."""

from __future__ import annotations

from servesim.latency.modelspec import ModelSpec
from servesim.simcore.errors import ScenarioError


def _divisors(heads: int) -> str:
    """The tp sizes that split ``heads`` evenly, as "1, 2, 4, 8" for an error's fix."""
    return ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)


def _heads_not_divided(
    model: ModelSpec, heads: int, what: str, tp: int, path: str
) -> ScenarioError:
    """The error for a ``tp`` that does not divide ``heads`` (``what`` names them)."""
    return ScenarioError(
        path,
        tp,
        f"{model.name} has {heads} {what}, which tp={tp} does not divide; "
        f"use one of {_divisors(heads)}",
    )


def check_tensor_parallel(
    model: ModelSpec, tp: int, path: str = "tp", *, kv_heads_divisible: bool = False
) -> None:
    """Tensor parallelism must split the attention heads evenly (vLLM's rule).

    KV heads: ``tp`` must divide them, or (GQA/MQA with fewer KV heads than GPUs) be a multiple
    of them, when vLLM replicates each KV head; ``kv_heads_divisible`` demands the former (the
    trained-physics model's validation, spec §3.3). MLA has no per-head KV cache to split.
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ScenarioError(path, tp, "tensor parallelism must be a positive integer")
    heads = model.num_heads
    if heads % tp:
        raise _heads_not_divided(model, heads, "attention heads (num_attention_heads)", tp, path)
    if model.is_mla:
        return
    kv = model.num_kv_heads
    if kv % tp == 0 or (not kv_heads_divisible and tp % kv == 0):
        return
    if kv_heads_divisible:
        fix = f"this latency model needs tp to divide them: use one of {_divisors(kv)}"
    else:
        fix = "tp must divide them or be a multiple of them"
    raise ScenarioError(path, tp, f"{model.name} has {kv} KV heads (num_key_value_heads); {fix}")


def _smallest_valid_tp(model: ModelSpec, minimum: int) -> int | None:
    """The smallest tp >= ``minimum`` that splits the model's heads (up to 4x ``minimum``)."""

    def valid_tp(t: int) -> bool:
        if model.num_heads % t:
            return False
        return model.is_mla or model.num_kv_heads < t or model.num_kv_heads % t == 0

    return next((t for t in range(minimum, 4 * minimum + 1) if valid_tp(t)), None)
