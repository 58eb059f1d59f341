"""Multimodal inputs: images or audio clips attached to a workload's requests.

Scenario schema (the ``workload.multimodal`` section, on any kind of workload)::

    multimodal:
      images: 2                  # per request, or {min: 1, max: 4} drawn uniformly
      tokens_per_image: 576      # embedding tokens per image, or {min: 256, max: 1024}
      fraction: 0.5              # share of requests that carry media (default 1)
    # or audio:
    multimodal: {audio_seconds: {min: 5, max: 30}, tokens_per_second: 25}

Each media item becomes a run of embedding tokens that joins the prompt: it occupies KV blocks and
is prefilled like text. In the request's content it is a segment of its own, placed after the
prompt's text (``[shared prefix][text][item 1][item 2]...``), with an id from a namespace no text
uses (:func:`media_segment`). Every item is distinct (a fresh id), so image tokens are never a
prefix-cache hit: repeated images (vLLM's hash of the image, which would let the same image's KV
and encoder output be reused) are not modelled. The encoder reads the items back from the
segments (:func:`media_items`), so a request carries its media with no new field.

A request without media is left exactly as the wrapped workload made it; the media draws come
from their own random stream (``workload/multimodal``), so the text of every request is the same
with or without this section. Sessions (follow-up rounds) are not combined with media.

:class:`MultimodalWorkload` wraps the workload the rest of the section describes and keeps, for
the auditor, which requests carry media (:class:`MediaBook`).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Mapping
from typing import Any

from servesim.simcore.config import as_float, as_int, check_keys, expect_mapping
from servesim.simcore.errors import ScenarioError
from servesim.simcore.rng import RandomStreams
from servesim.workloads.base import RequestSpec

MULTIMODAL_FIELDS = ("images", "tokens_per_image", "audio_seconds", "tokens_per_second", "fraction")

MEDIA_SEGMENT_BASE = 1 << 50
"""Media segment ids are ``-(MEDIA_SEGMENT_BASE + serial)``: below every prefix-group, request
and trace segment id (trace ids start at ``-(1 << 40)``)."""

DEFAULT_TOKENS_PER_SECOND = 25
"""Qwen2-Audio: Whisper's 50 frames per second, pooled 2x."""


def media_segment(serial: int) -> int:
    """Segment id of the ``serial``-th media item of a run (distinct for every item)."""
    return -(MEDIA_SEGMENT_BASE + serial)


def media_items(segments: tuple[tuple[int, int], ...] | None) -> list[int]:
    """Embedding token counts of the media items in a request's content segments."""
    if not segments:
        return []
    return [length for segment, length in segments if segment <= -MEDIA_SEGMENT_BASE]


class _Range:
    """A whole or real number drawn uniformly from [low, high] (low == high: fixed)."""

    __slots__ = ("low", "high")

    def __init__(self, low: float, high: float):
        self.low = low
        self.high = high

    @classmethod
    def parse(cls, value: Any, path: str, *, whole: bool, minimum: float) -> _Range:
        def one(v: Any, p: str) -> float:
            if whole:
                return as_int(v, p, minimum=int(minimum))
            return as_float(v, p, exclusive_minimum=minimum)

        if isinstance(value, Mapping):
            check_keys(value, ("min", "max"), path)
            for key in ("min", "max"):
                if value.get(key) is None:
                    raise ScenarioError(f"{path}.{key}", None, "missing; give both min and max")
            low, high = one(value["min"], f"{path}.min"), one(value["max"], f"{path}.max")
            if high < low:
                raise ScenarioError(
                    f"{path}.max", value["max"], f"below min ({low}); give max >= min"
                )
            return cls(low, high)
        v = one(value, path)
        return cls(v, v)

    def draw(self, rng: Any, whole: bool) -> float:
        if self.low == self.high:
            return self.low
        if whole:
            return int(rng.integers(self.low, self.high + 1))
        return float(rng.uniform(self.low, self.high))

    def describe(self) -> Any:
        return self.low if self.low == self.high else {"min": self.low, "max": self.high}


class MediaInputs:
    """What media each request carries: images (a count and tokens per image) or one audio clip
    (seconds and tokens per second), on a ``fraction`` of the requests."""

    __slots__ = ("kind", "count", "tokens", "seconds", "tokens_per_second", "fraction")

    def __init__(
        self,
        kind: str,
        count: _Range,
        tokens: _Range,
        seconds: _Range | None,
        tokens_per_second: int,
        fraction: float,
    ):
        self.kind = kind
        self.count = count
        self.tokens = tokens
        self.seconds = seconds
        self.tokens_per_second = tokens_per_second
        self.fraction = fraction

    @classmethod
    def from_config(cls, value: Any, path: str) -> MediaInputs:
        section = expect_mapping(value, path)
        check_keys(section, MULTIMODAL_FIELDS, path)
        has_images = section.get("images") is not None
        has_audio = section.get("audio_seconds") is not None
        if has_images == has_audio:
            raise ScenarioError(
                path,
                dict(section),
                "give images (with tokens_per_image) or audio_seconds (with tokens_per_second), "
                "one of the two",
            )
        fraction = 1.0
        if section.get("fraction") is not None:
            fraction = as_float(
                section["fraction"], f"{path}.fraction", exclusive_minimum=0.0, maximum=1.0
            )
        if has_images:
            for wrong in ("tokens_per_second",):
                if section.get(wrong) is not None:
                    raise ScenarioError(
                        f"{path}.{wrong}",
                        section[wrong],
                        "an audio field; images take tokens_per_image",
                    )
            if section.get("tokens_per_image") is None:
                raise ScenarioError(
                    f"{path}.tokens_per_image",
                    None,
                    "missing; give the embedding tokens per image (e.g. 576 for LLaVA-1.5 at "
                    "336 px, 1024 for a 896x896 image in Qwen2-VL)",
                )
            count = _Range.parse(section["images"], f"{path}.images", whole=True, minimum=0)
            tokens = _Range.parse(
                section["tokens_per_image"], f"{path}.tokens_per_image", whole=True, minimum=1
            )
            return cls("image", count, tokens, None, 0, fraction)
        if section.get("tokens_per_image") is not None:
            raise ScenarioError(
                f"{path}.tokens_per_image",
                section["tokens_per_image"],
                "an image field; audio takes tokens_per_second",
            )
        seconds = _Range.parse(
            section["audio_seconds"], f"{path}.audio_seconds", whole=False, minimum=0.0
        )
        tps = as_int(
            section.get("tokens_per_second", DEFAULT_TOKENS_PER_SECOND),
            f"{path}.tokens_per_second",
            minimum=1,
        )
        return cls("audio", _Range(1, 1), _Range(0, 0), seconds, tps, fraction)

    def draw(self, rng: Any) -> list[int]:
        """One request's media items (their embedding token counts; empty: no media)."""
        if self.fraction < 1.0 and rng.random() >= self.fraction:
            return []
        if self.seconds is not None:
            seconds = self.seconds.draw(rng, whole=False)
            return [max(1, math.ceil(seconds * self.tokens_per_second))]
        count = int(self.count.draw(rng, whole=True))
        return [int(self.tokens.draw(rng, whole=True)) for _ in range(count)]

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "fraction": self.fraction}
        if self.seconds is not None:
            d.update(
                audio_seconds=self.seconds.describe(), tokens_per_second=self.tokens_per_second
            )
        else:
            d.update(images=self.count.describe(), tokens_per_image=self.tokens.describe())
        return d


class MediaBook:
    """Which requests of a run carry media and how many embedding tokens in all: what the
    auditor holds the encode log against. Ids are the cluster's request ids (arrival order)."""

    __slots__ = ("ids", "tokens", "items")

    def __init__(self) -> None:
        self.ids = array("q")
        self.tokens = array("q")
        self.items = array("q")


class MultimodalWorkload:
    """A workload whose requests carry media (module docstring). Everything but the request
    stream is the wrapped workload's: its attributes are read through.

    ``media`` applies to every request (None: none), ``by_client`` to one client's requests of a
    workload spec (it overrides ``media`` for them). The whole workload's media draw from
    ``workload/multimodal``, a client's from ``workload/<client>/multimodal``, so changing one
    client's media never shifts another's draws."""

    def __init__(
        self,
        inner: Any,
        media: MediaInputs | None,
        by_client: Mapping[str, MediaInputs] | None = None,
    ):
        self.inner = inner
        self.media = media
        self.by_client = dict(by_client or {})
        self.book = MediaBook()  # of the latest stream drawn by requests()

    def __getattr__(self, name: str) -> Any:
        # only called for names this wrapper does not define: the wrapped workload's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def requests(self, streams: RandomStreams) -> Iterator[RequestSpec]:
        self.book = book = MediaBook()
        return self._with_media(self.inner.requests(streams), streams, book)

    def _draws(self, streams: RandomStreams) -> dict[str, tuple[MediaInputs, Any]]:
        """Each client's media and random stream ("" : every other request's)."""
        draws = {
            cid: (media, streams.fresh(f"workload/{cid}/multimodal"))
            for cid, media in self.by_client.items()
        }
        if self.media is not None:
            draws[""] = (self.media, streams.fresh("workload/multimodal"))
        return draws

    def _with_media(self, specs: Iterator[RequestSpec], streams: RandomStreams, book: MediaBook):
        draws = self._draws(streams)
        everyone = draws.get("")
        serial = 0
        for k, spec in enumerate(specs):
            chosen = draws.get(spec.client, everyone)
            if chosen is None:
                yield spec
                continue
            media, rng = chosen
            items = media.draw(rng)
            if items:
                segments = spec.segments
                if segments is None:
                    # [shared prefix][own text]: the request's own segment is 2 * its id, the
                    # id the cluster gives the k-th arrival (no sessions: one id per spec)
                    own = ((2 * k, spec.prompt_tokens - spec.prefix_tokens),)
                    if spec.prefix_group >= 0 and spec.prefix_tokens:
                        segments = ((-1 - spec.prefix_group, spec.prefix_tokens), *own)
                    else:
                        segments = own
                added = tuple((media_segment(serial + j), t) for j, t in enumerate(items))
                serial += len(items)
                spec.segments = segments + added
                extra = sum(items)
                spec.prompt_tokens += extra
                book.ids.append(k)
                book.tokens.append(extra)
                book.items.append(len(items))
            yield spec

    def describe(self) -> dict[str, Any]:
        d = dict(self.inner.describe())
        if self.media is not None:
            d["multimodal"] = self.media.describe()
        for client in d.get("clients", ()):
            media = self.by_client.get(client.get("id")) if isinstance(client, dict) else None
            if media is not None:
                client["multimodal"] = media.describe()
        return d

    def __repr__(self) -> str:
        return f"MultimodalWorkload({self.inner!r})"


def has_media(section: Mapping[str, Any]) -> bool:
    """Whether a ``workload:`` section gives media, for all requests or for a client."""
    if section.get("multimodal") is not None:
        return True
    clients = section.get("clients")
    return isinstance(clients, list) and any(
        isinstance(c, Mapping) and c.get("multimodal") is not None for c in clients
    )


def with_media(section: Mapping[str, Any], path: str, build: Any) -> MultimodalWorkload:
    """The workload of ``section`` without its ``multimodal`` keys (made by ``build``), wrapped
    with the media they describe (``workload.multimodal``, ``workload.clients[i].multimodal``)."""
    media = None
    if section.get("multimodal") is not None:
        media = MediaInputs.from_config(section["multimodal"], f"{path}.multimodal")
    rest = {k: v for k, v in section.items() if k != "multimodal"}
    by_client: dict[str, MediaInputs] = {}
    clients = section.get("clients")
    if isinstance(clients, list):
        rest["clients"] = []
        for i, entry in enumerate(clients):
            if isinstance(entry, Mapping) and entry.get("multimodal") is not None:
                where = f"{path}.clients[{i}].multimodal"
                by_client[str(entry.get("id"))] = MediaInputs.from_config(
                    entry["multimodal"], where
                )
                entry = {k: v for k, v in entry.items() if k != "multimodal"}
            rest["clients"].append(entry)
    inner = build(rest)
    if getattr(inner, "sessions", None):
        raise ScenarioError(
            f"{path}.multimodal",
            section.get("multimodal"),
            "media inputs are not combined with sessions (follow-up rounds); remove "
            "workload.sessions or workload.multimodal",
        )
    return MultimodalWorkload(inner, media, by_client)
