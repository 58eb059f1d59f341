"""Multimodal encode conservation (ENC-1…4): every request with media is encoded exactly once,
before its first prefill, and in an encode-pool run its embeddings are sent exactly once.

Reads ``AuditInput.encode`` (None: the run had no encoder): the encode log (one row per
encoding, columns of :data:`servesim.components.encode.ENCODE_COLUMNS`), which requests the
workload gave media and how many embedding tokens (``media_ids``, ``media_tokens``), the
placement (``mode``: colocated or pool), the bytes of one embedding token and the embedding
links' counters. The workload's media book is independent of the engine's: the engine finds
media in a request's content, the book was written when the workload drew them.

* ENC-1 — no request is encoded twice.
* ENC-2 — every request with media whose prefill started was encoded, with all its tokens, and
  no request without media was.
* ENC-3 — the encoding came before the request's first prefill: colocated, in the very step that
  scheduled its first chunk, on that instance; in a pool, encode end ≤ embedding transfer start
  ≤ transfer end ≤ the request's enqueue at its prefill instance ≤ its first scheduling, and the
  embeddings went to that instance.
* ENC-4 — pool only: each encoding's embeddings were sent once, with tokens × bytes per token
  bytes, and the links started and delivered as many transfers as the log shows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from servesim.audit.base import AuditInput, Violation, _first_bad


def check_encode(data: AuditInput) -> Iterator[Violation]:
    """ENC-1…4 over the encode log and the request table (nothing to check without an encoder)."""
    enc = data.encode
    if enc is None:
        return
    log: Mapping[str, np.ndarray] = enc["log"]
    r = data.requests
    req = log["request"]
    ids, counts = np.unique(req, return_counts=True)
    for i in _first_bad(counts > 1):
        yield Violation("ENC-1", f"encoded {counts[i]} times", request=int(ids[i]))
    yield from _media_conservation(data, enc, log)
    if not len(req):
        return
    rows = _rows_of(r["id"], req)
    known = rows >= 0
    for i in _first_bad(~known):
        yield Violation("ENC-3", "encoded, but the request has no row", request=int(req[i]))
    first = np.where(known, r["first_scheduled_us"][np.maximum(rows, 0)], -1)
    where = _prefill_instance(r)[np.maximum(rows, 0)]
    if enc["mode"] == "colocated":
        bad = known & ((first != log["start_us"]) | (where != log["server"]))
        for i in _first_bad(bad):
            yield Violation(
                "ENC-3",
                f"encoded at {log['start_us'][i]} µs on instance {log['server'][i]}, first "
                f"scheduled at {first[i]} µs on instance {where[i]}",
                request=int(req[i]),
            )
        return
    yield from _pool_order(log, r, rows, known, first, where)
    yield from _pool_transfers(enc, log, r, rows, known)


def _media_conservation(
    data: AuditInput, enc: Mapping[str, Any], log: Mapping[str, np.ndarray]
) -> Iterator[Violation]:
    """ENC-2: the requests with media that started prefill are exactly the encoded ones."""
    r = data.requests
    media = np.asarray(enc["media_ids"], dtype=np.int64)
    tokens = np.asarray(enc["media_tokens"], dtype=np.int64)
    arrived = media < data.arrived
    media, tokens = media[arrived], tokens[arrived]
    rows = _rows_of(r["id"], media)
    started = np.zeros(len(media), dtype=bool)
    ok = rows >= 0
    started[ok] = r["first_scheduled_us"][rows[ok]] >= 0
    logged = _rows_of(log["request"], media)
    for i in _first_bad(started & (logged < 0)):
        yield Violation("ENC-2", "prefill started without its media encoded", request=int(media[i]))
    has_row = logged >= 0
    mismatch = np.zeros(len(media), dtype=bool)
    mismatch[has_row] = log["tokens"][logged[has_row]] != tokens[has_row]
    for i in _first_bad(mismatch):
        yield Violation(
            "ENC-2",
            f"encoded {log['tokens'][logged[i]]} tokens of its {tokens[i]} media tokens",
            request=int(media[i]),
        )
    stray = _rows_of(media, log["request"]) < 0
    for i in _first_bad(stray):
        yield Violation("ENC-2", "encoded, but it carries no media", request=int(log["request"][i]))


def _pool_order(log, r, rows, known, first, where) -> Iterator[Violation]:
    """ENC-3 in a pool: encode → send → arrive → enqueue at the prefill instance → schedule."""
    enqueue = np.where(known, r["enqueue_us"][np.maximum(rows, 0)], -1)
    chain = (
        ("end_us", log["end_us"]),
        ("transfer_start_us", log["transfer_start_us"]),
        ("transfer_end_us", log["transfer_end_us"]),
        ("enqueue_us", enqueue),
        ("first_scheduled_us", first),
    )
    for (name_a, a), (name_b, b) in zip(chain, chain[1:]):
        for i in _first_bad(known & (a >= 0) & (b >= 0) & (b < a)):
            yield Violation(
                "ENC-3",
                f"{name_b} ({b[i]}) precedes {name_a} ({a[i]})",
                request=int(log["request"][i]),
                time_us=int(b[i]),
            )
    for i in _first_bad(known & (first >= 0) & (where != log["target"])):
        yield Violation(
            "ENC-3",
            f"embeddings sent to instance {log['target'][i]}, prefill ran on {where[i]}",
            request=int(log["request"][i]),
        )


def _pool_transfers(enc, log, r, rows, known) -> Iterator[Violation]:
    """ENC-4: one embedding transfer per encoding, of the right size, matching the links."""
    sent = log["transfer_start_us"] >= 0
    arrived = log["transfer_end_us"] >= 0
    enqueued = known & (r["enqueue_us"][np.maximum(rows, 0)] >= 0)
    for i in _first_bad(enqueued & ~arrived):
        yield Violation(
            "ENC-4",
            "enqueued for prefill before its embeddings arrived",
            request=int(log["request"][i]),
        )
    size = log["tokens"] * int(enc["bytes_per_token"])
    for i in _first_bad(sent & (log["bytes"] != size)):
        yield Violation(
            "ENC-4",
            f"sent {log['bytes'][i]} bytes for {log['tokens'][i]} tokens (expected {size[i]})",
            request=int(log["request"][i]),
        )
    links = enc["links"]
    started = sum(link["started"] for link in links)
    completed = sum(link["completed"] for link in links)
    if started != int(sent.sum()) or completed != int(arrived.sum()):
        yield Violation(
            "ENC-4",
            f"the embedding links started {started} and delivered {completed} transfers; the "
            f"encode log shows {int(sent.sum())} sent and {int(arrived.sum())} arrived",
        )


def _rows_of(table_ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Row of each ``wanted`` id in ``table_ids`` (-1 where absent; first row of a repeat)."""
    table_ids = np.asarray(table_ids, dtype=np.int64)
    wanted = np.asarray(wanted, dtype=np.int64)
    if not len(table_ids):
        return np.full(len(wanted), -1, dtype=np.int64)
    order = np.argsort(table_ids, kind="stable")
    ordered = table_ids[order]
    pos = np.searchsorted(ordered, wanted)
    pos = np.minimum(pos, len(ordered) - 1)
    found = ordered[pos] == wanted
    return np.where(found, order[pos], -1)


def _prefill_instance(r: Mapping[str, np.ndarray]) -> np.ndarray:
    """Where each request's prefill ran: its prefill instance when it was split, else its own."""
    prefill = r.get("prefill_instance")
    if prefill is None:
        return r["instance"]
    return np.where(prefill >= 0, prefill, r["instance"])
