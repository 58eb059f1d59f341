"""Prompts built to hit target token counts, with the same text for the same shared prefix.

A real server sees text, the simulator sees token counts: to measure what the simulator predicts,
each request's prompt must be ``prompt_tokens`` long in the server's own tokenizer, its first
``prefix_tokens`` identical for every request of its prefix group (so the server's prefix cache
finds them) and the rest unique to the request (so it finds nothing more).

Two ways to size the text:

* **a tokenizer** (``tokenizers`` or ``transformers`` installed and the model's tokenizer on
  disk; never downloaded): token ids are drawn, decoded and re-encoded until the count is exact;
* **a words-per-token ratio** otherwise: the words come from :data:`VOCABULARY`, common English
  words that the BPE tokenizers of Llama, Qwen, Mistral and GPT each encode as one token with
  their leading space, so the default ratio is 1.0 word per token. ``--calibrate-ratio`` measures
  the server's real ratio and fixed overhead (BOS, chat template) from ``usage.prompt_tokens``.

Either way a linear correction ``tokens = overhead + scale × built`` measured by calibration maps
the target count to what to build (:meth:`PromptBuilder.calibrated`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from servesim.simcore.errors import ScenarioError
from servesim.workloads.base import RequestSpec

DEFAULT_WORDS_PER_TOKEN = 1.0
"""Words of :data:`VOCABULARY` per token when no tokenizer is available (see the module doc)."""

VOCABULARY: tuple[str, ...] = tuple(
    """the of and to in is that it was for on are as with his they at be this from have or by
    one had not but what all were when we there can an your which their said if do will each about
    how up out them then she many some so these would other into has more her two like him see time
    could no make than first been its who now people my made over did down only way find use may
    water long little very after words called just where most know get through back much go good
    new write our me man too any day same right look think also around another came come work three
    word must because does part even place well such here take why things help put years different
    away again off went old number great tell men say small every found still between name should
    home big give air line set own under read last never us left end along while might next sound
    below saw something thought both few those always looked show large often together asked house
    world going want school important until form food keep children feet land side without boy once
    animals life enough took sometimes four head above kind began almost live page got earth need far
    hand high year mother light parts country father let night following picture being study second
    eyes soon times story boys since white days ever paper hard near sentence better best across
    during today others however sure means knew try told young miles sun ways thing whole hear example
    heard several change answer room sea against top turned learn point city play toward five using
    himself usually""".split()
)
"""Common English words, each one token (with its leading space) in the usual BPE vocabularies."""


def _rng(*key: Any) -> np.random.Generator:
    """A generator keyed by ``key``: the same key gives the same words in every run."""
    digest = hashlib.blake2b(repr(key).encode("utf-8"), digest_size=16).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


class Tokenizer:
    """The two calls prompt building needs from a real tokenizer: ``encode`` (no special tokens)
    and ``decode``. Wraps a ``tokenizers.Tokenizer`` or a ``transformers`` tokenizer."""

    def __init__(
        self,
        name: str,
        encode: Callable[[str], Sequence[int]],
        decode: Callable[[Sequence[int]], str],
        vocab_size: int,
    ):
        self.name = name
        self.encode = encode
        self.decode = decode
        self.vocab_size = vocab_size


def load_tokenizer(choice: str | None, model: str) -> Tokenizer | None:
    """The tokenizer ``choice`` names (a tokenizer.json file, a folder, or a model name), or with
    ``choice`` None the model's own when one is on disk; None with ``choice`` ``"none"`` or when
    nothing usable is installed or cached. Never downloads: only local files are read."""
    if choice == "none":
        return None
    target = choice or model
    path = Path(target)
    file: Path | None = path / "tokenizer.json" if path.is_dir() else path
    if file is None or not file.is_file():
        file = _cached_tokenizer_file(target)
    hf_tokenizer = _tokenizers_class() if file is not None and file.is_file() else None
    if hf_tokenizer is not None:
        tok = hf_tokenizer.from_file(str(file))
        return Tokenizer(
            str(file),
            lambda text: tok.encode(text, add_special_tokens=False).ids,
            lambda ids: tok.decode(list(ids)),
            tok.get_vocab_size(),
        )
    try:
        from transformers import AutoTokenizer
    except ImportError:
        AutoTokenizer = None
    if AutoTokenizer is not None:
        try:
            auto = AutoTokenizer.from_pretrained(
                str(file.parent) if file is not None else target, local_files_only=True
            )
        except Exception:  # noqa: BLE001 - any failure to find it locally means "no tokenizer"
            auto = None
        if auto is not None:
            return Tokenizer(
                target,
                lambda text: auto.encode(text, add_special_tokens=False),
                lambda ids: auto.decode(list(ids)),
                len(auto),
            )
    if choice is not None:
        raise ScenarioError(
            "--tokenizer",
            choice,
            "no usable tokenizer there: give a tokenizer.json file or a folder holding one "
            "(with the tokenizers or transformers package installed), or --tokenizer none to "
            "size prompts by the words-per-token ratio",
        )
    return None


def _cached_tokenizer_file(model: str) -> Path | None:
    """The model's tokenizer.json in the local Hugging Face cache, if it is there."""
    import os

    if "/" not in model:
        return None
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    hub = Path(os.environ.get("HF_HUB_CACHE", home / "hub"))
    snapshots = hub / ("models--" + model.replace("/", "--")) / "snapshots"
    if not snapshots.is_dir():
        return None
    found = sorted(snapshots.glob("*/tokenizer.json"))
    return found[-1] if found else None


class PromptBuilder:
    """Build the prompt text of a request: its shared prefix (cached per group), then its own.

    ``seed`` keys every word drawn, so the same request gets the same text in every run and
    different requests differ from their first token. ``overhead`` and ``scale`` are the linear
    correction measured by calibration (module doc): the server counts ``overhead + scale × n``
    tokens for a prompt built as ``n``.
    """

    def __init__(
        self,
        *,
        tokenizer: Tokenizer | None = None,
        words_per_token: float = DEFAULT_WORDS_PER_TOKEN,
        seed: int = 0,
        overhead: float = 0.0,
        scale: float = 1.0,
    ):
        if not words_per_token > 0:
            raise ScenarioError(
                "--words-per-token", words_per_token, "must be a positive number (default 1.0)"
            )
        self.tokenizer = tokenizer
        self.words_per_token = float(words_per_token)
        self.seed = seed
        self.overhead = float(overhead)
        self.scale = float(scale)
        self._prefixes: dict[Any, str] = {}

    def calibrated(self, overhead: float, scale: float) -> PromptBuilder:
        """A builder with the server's measured correction (``tokens = overhead + scale × n``)."""
        if not scale > 0:
            raise ScenarioError(
                "--calibrate-ratio",
                scale,
                "the server's prompt token counts did not grow with the prompt; check that the "
                "server reports usage.prompt_tokens, or give --words-per-token instead",
            )
        return PromptBuilder(
            tokenizer=self.tokenizer,
            words_per_token=self.words_per_token,
            seed=self.seed,
            overhead=overhead,
            scale=scale,
        )

    @property
    def method(self) -> str:
        """How counts are hit, for meta.json and the console."""
        how = (
            f"tokenizer {self.tokenizer.name}"
            if self.tokenizer is not None
            else f"{self.words_per_token:.2f} words per token"
        )
        if self.overhead or self.scale != 1.0:
            how += f", calibrated (server tokens = {self.overhead:.1f} + {self.scale:.3f} x built)"
        return how

    def prompt(self, spec: RequestSpec, *, salt: str = "") -> str:
        """The prompt of ``spec``: ``spec.prompt_tokens`` tokens, sharing its group's prefix.

        Requests with content ``segments`` (traces such as Mooncake's) get one text per segment
        id, so prompts that share leading segments share text. ``salt`` makes a distinct prompt
        of the same size with no shared prefix (warm-up requests).
        """
        total = spec.prompt_tokens
        if salt:
            return self._piece(total, "own", salt, spec.id, first=True)
        if spec.segments is not None:
            parts = []
            for i, (segment, length) in enumerate(spec.segments):
                parts.append(self._shared(("segment", segment, length), length, first=i == 0))
            return "".join(parts)
        prefix = spec.prefix_tokens if spec.prefix_group >= 0 else 0
        head = (
            self._shared(("group", spec.prefix_group, prefix), prefix, first=True) if prefix else ""
        )
        if prefix >= total:
            return head  # the whole prompt is the group's
        return head + self._piece(total - prefix, "own", spec.id, first=not prefix)

    def _shared(self, key: Any, tokens: int, *, first: bool) -> str:
        text = self._prefixes.get(key)
        if text is None:
            text = self._piece(tokens, *key, first=first)
            self._prefixes[key] = text
        return text

    def _piece(self, tokens: int, *key: Any, first: bool) -> str:
        """Text of ``tokens`` tokens keyed by ``key``; the first piece of a prompt carries the
        server's fixed overhead (taken off its size)."""
        want = (tokens - (self.overhead if first else 0.0)) / self.scale
        want = max(1, round(want))
        rng = _rng(self.seed, *key)
        if self.tokenizer is not None:
            return self._exact(want, rng)
        words = max(1, round(want * self.words_per_token))
        picks = rng.integers(0, len(VOCABULARY), size=words)
        return "".join(" " + VOCABULARY[int(i)] for i in picks)

    def _exact(self, tokens: int, rng: np.random.Generator) -> str:
        """Text that the tokenizer encodes as exactly ``tokens`` ids, or as near as four rounds
        get (a decode/encode round trip can merge or split ids at the cut)."""
        tok = self.tokenizer
        assert tok is not None
        picks = rng.integers(0, len(VOCABULARY), size=tokens * 2 + 8)
        ids = list(tok.encode("".join(" " + VOCABULARY[int(i)] for i in picks)))
        take = tokens
        text = tok.decode(ids[:take])
        for _ in range(4):
            got = len(tok.encode(text))
            if got == tokens:
                break
            take = max(1, take - (got - tokens))
            text = tok.decode(ids[:take])
        return text


def fit_correction(samples: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """``(overhead, scale)`` of ``tokens = overhead + scale × built`` fitted (least squares) to
    ``(built, tokens counted by the server)`` pairs of at least two distinct sizes."""
    built = np.asarray([s[0] for s in samples], dtype=np.float64)
    counted = np.asarray([s[1] for s in samples], dtype=np.float64)
    if len(set(built.tolist())) < 2:
        raise ValueError("calibration needs prompts of at least two sizes")
    scale, overhead = np.polyfit(built, counted, 1)
    return float(overhead), float(scale)


def _tokenizers_class() -> Any:
    """The ``tokenizers`` package's Tokenizer class, or None when it is not installed."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    return Tokenizer
