"""The ``mooncake`` trace format: Mooncake FAST'25 JSONL, hash ids mapped onto content segments."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import ClassVar

from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import register
from servesim.workloads.base import TRACE_SEGMENT_BASE, trace_segment
from servesim.workloads.traces.reader import TraceFormat, _Bad, _open_text
from servesim.workloads.traces.table import TableBuilder, TraceTable

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per Mooncake hash id (the FAST'25 release's block size)."""

TRACE_PRIVATE_BASE = 1 << 36
"""Block ids from here on are private remainders (``TRACE_PRIVATE_BASE + row``), never hash ids."""


@register("trace_format", "mooncake")
class MooncakeFormat(TraceFormat):
    """Mooncake JSONL: one ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}`` per
    line. Hash ids are content blocks of ``block_tokens`` (512) tokens, mapped onto segments as the
    module docstring says; ``hash_ids`` may be absent (a fully private prompt)."""

    name = "mooncake"
    description = "Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids"
    options = ("block_tokens",)
    KEYS: ClassVar[tuple[str, ...]] = ("timestamp", "input_length", "output_length", "hash_ids")

    def __init__(self, block_tokens: int = MOONCAKE_BLOCK_TOKENS):
        self.block_tokens = int(block_tokens)

    @classmethod
    def sniff(cls, file: Path, first_line: str) -> bool:
        return first_line.startswith("{") and '"input_length"' in first_line

    def read(self, file: Path) -> TraceTable:
        b = TableBuilder(file, self.name)
        block = self.block_tokens
        base = TRACE_SEGMENT_BASE
        private = 0
        ignored: dict[str, None] = {}
        row = 0
        with _open_text(file) as fh:
            for line, text in enumerate(fh, start=1):
                if not text.strip():
                    continue
                where = f"{file}:{line}"
                try:
                    rec = json.loads(text)
                except ValueError as exc:
                    raise ScenarioError(
                        where, text.strip()[:60], f"not valid JSON ({exc})"
                    ) from None
                if not isinstance(rec, dict):
                    raise ScenarioError(where, rec, "expected a JSON object per line")
                try:
                    t = _json_time(rec, "timestamp")
                    prompt = _json_count(rec, "input_length", 1)
                    output = _json_count(rec, "output_length", 0)
                    hashes = rec.get("hash_ids", [])
                    if not isinstance(hashes, list) or not all(
                        type(h) is int and h >= 0 for h in hashes
                    ):
                        raise _Bad("hash_ids", hashes, "expected a list of integers >= 0")
                    n = len(hashes)
                    if n and prompt <= block * (n - 1):
                        raise _Bad(
                            "hash_ids",
                            f"{n} ids",
                            f"input_length {prompt} fills at most {-(-prompt // block)} blocks "
                            f"of {block} tokens",
                        )
                    if n and max(hashes) >= TRACE_PRIVATE_BASE:
                        raise _Bad("hash_ids", max(hashes), f"ids must be < {TRACE_PRIVATE_BASE}")
                except _Bad as err:
                    raise ScenarioError(
                        where, err.value, f"field {err.column}: {err.what}"
                    ) from None
                for key in rec:
                    if key not in self.KEYS:
                        ignored[key] = None
                b.add(line, t, prompt, output)
                ids = [-(base + h) for h in hashes]
                lens = [block] * n
                covered = block * n
                if n and prompt < covered:
                    lens[-1] = prompt - block * (n - 1)
                elif prompt > covered:
                    ids.append(trace_segment(TRACE_PRIVATE_BASE + row))
                    lens.append(prompt - covered)
                    private += 1
                b.add_segments(ids, lens)
                row += 1
        notes = [
            f"hash_ids mapped to segments of {block} tokens (the last block of a prompt partial)"
        ]
        if private:
            notes.append(
                f"{private} prompts extend past their hash ids: the rest is a private segment"
            )
        return b.build(ignored=list(ignored), notes=notes)


def _json_count(rec: dict, key: str, minimum: int) -> int:
    if key not in rec:
        raise _Bad(key, None, "missing")
    value = rec[key]
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not int:
        raise _Bad(key, value, "expected a whole number")
    if value < minimum:
        raise _Bad(key, value, "must not be negative" if value < 0 else f"must be >= {minimum}")
    return value


def _json_time(rec: dict, key: str) -> int:
    if key not in rec:
        raise _Bad(key, None, "missing")
    value = rec[key]
    if type(value) is int:
        if value < 0:
            raise _Bad(key, value, "must not be negative")
        return value * 1000
    if type(value) is float and math.isfinite(value):
        if value < 0:
            raise _Bad(key, value, "must not be negative")
        return int(round(value * 1000))
    raise _Bad(key, value, "expected a time in milliseconds")
