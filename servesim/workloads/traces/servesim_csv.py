"""The ``servesim`` trace format: servesim's own CSV (``# servesim-trace v1``), every RequestSpec field."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import register
from servesim.workloads.base import TRACE_SEGMENT_BASE
from servesim.workloads.traces.reader import (
    TraceFormat,
    _Bad,
    _count,
    _csv_file,
    _label_codes,
    _prefix_tokens,
    _time_us,
)
from servesim.workloads.traces.table import TableBuilder, TraceTable

SERVESIM_MAGIC = "# servesim-trace v1"


@register("trace_format", "servesim")
class ServesimFormat(TraceFormat):
    """servesim's own trace CSV (optionally gzipped). See the module docstring and the how-to.

    ::

        # servesim-trace v1
        # block_tokens: 512
        arrival_us,input_tokens,output_tokens,segments
        0,6758,500,0..12 13:102

    ``input_tokens`` is the whole prompt (shared prefix included). ``segments`` items are ``B:N``
    (content block B, N tokens), ``B`` (one full block of ``block_tokens``) or ``A..B`` (blocks
    A to B, each full); block B is the RequestSpec segment ``trace_segment(B)``.
    """

    name = "servesim"
    description = "servesim trace CSV (# servesim-trace v1), every RequestSpec field"
    REQUIRED: ClassVar[tuple[str, ...]] = ("arrival_us", "input_tokens", "output_tokens")
    OPTIONAL: ClassVar[tuple[str, ...]] = (
        "max_output_tokens",
        "prefix_group",
        "prefix_tokens",
        "slo_class",
        "client",
        "tenant",
        "segments",
        "model",  # LoRA / several models: the model and the adapter a request names
        "adapter",
    )

    @classmethod
    def sniff(cls, file: Path, first_line: str) -> bool:
        return first_line.startswith("# servesim-trace")

    def read(self, file: Path) -> TraceTable:
        b = TableBuilder(file, self.name)
        with _csv_file(file, comments=True) as rows:
            self._metadata(file, rows.comments, b)
            col, _ = rows.columns(self.REQUIRED, self.OPTIONAL, strict=True)
            if ("prefix_group" in col) != ("prefix_tokens" in col):
                raise rows.header_error(
                    "prefix_group and prefix_tokens go together: give both columns or neither"
                )
            block = b.metadata.get("block_tokens")
            i_t, i_in, i_out = col["arrival_us"], col["input_tokens"], col["output_tokens"]
            i_max = col.get("max_output_tokens")
            i_grp = col.get("prefix_group")
            i_pre = col.get("prefix_tokens")
            i_slo, i_cli, i_ten = col.get("slo_class"), col.get("client"), col.get("tenant")
            i_seg = col.get("segments")
            i_model, i_adapter = col.get("model"), col.get("adapter")
            named = i_model is not None or i_adapter is not None
            for line, cells in rows:
                t = _time_us(cells[i_t], "arrival_us", 1)
                prompt = _count(cells[i_in], "input_tokens", 1)
                output = _count(cells[i_out], "output_tokens")
                max_out = -1
                if i_max is not None and cells[i_max].strip():
                    max_out = _count(cells[i_max], "max_output_tokens")
                group, prefix = -1, 0
                if i_grp is not None and i_pre is not None:
                    text = cells[i_grp].strip()
                    if text and not text.lstrip("-").isdigit():
                        raise _Bad("prefix_group", text, "expected an integer (-1 = none)")
                    group = int(text) if text else -1
                    if group < -1:
                        raise _Bad("prefix_group", text, "expected -1 (none) or a group >= 0")
                    prefix = _prefix_tokens(cells[i_pre], prompt)
                slo, cli, ten = _label_codes(b, cells, i_slo, i_cli, i_ten)
                segs = None
                if i_seg is not None and cells[i_seg].strip():
                    segs = _parse_segments(cells[i_seg], block, prompt)
                b.add(line, t, prompt, output, group, prefix, max_out, slo, cli, ten)
                if segs is not None:
                    b.add_segments(*segs)
                if named:  # LoRA / several models
                    b.add_names(
                        cells[i_model].strip() if i_model is not None else "",
                        cells[i_adapter].strip() if i_adapter is not None else "",
                    )
        return b.build()

    @staticmethod
    def _metadata(file: Path, comments: list[tuple[int, str]], b: TableBuilder) -> None:
        if not comments or not comments[0][1].startswith(SERVESIM_MAGIC):
            line = comments[0][0] if comments else 1
            raise ScenarioError(
                f"{file}:{line}",
                comments[0][1] if comments else None,
                f"a servesim trace starts with the line {SERVESIM_MAGIC!r}",
            )
        for line, text in comments[1:]:
            key, sep, value = text.lstrip("#").strip().partition(":")
            if not sep:
                continue  # a free-form comment
            key, value = key.strip(), value.strip()
            if key == "block_tokens":
                try:
                    b.metadata[key] = _count(value, "block_tokens", 1)
                except _Bad as err:
                    raise ScenarioError(
                        f"{file}:{line}", value, f"block_tokens {err.what}"
                    ) from None
            else:
                b.metadata[key] = value


def _parse_segments(text: str, block: int | None, prompt: int) -> tuple[list[int], list[int]]:
    """Parse a ``segments`` cell into (segment ids, lengths) summing to ``prompt``."""
    ids: list[int] = []
    lens: list[int] = []
    base = TRACE_SEGMENT_BASE
    for item in text.split():
        try:
            if ":" in item:
                h, _, n = item.partition(":")
                length = int(n)
                if length < 1:
                    raise _Bad("segments", item, "a segment has at least 1 token")
                ids.append(-(base + int(h)))
                lens.append(length)
                continue
            if block is None:
                raise _Bad(
                    "segments",
                    item,
                    "a bare block id needs a '# block_tokens: N' header line; "
                    "or write BLOCK:TOKENS",
                )
            if ".." in item:
                a, _, z = item.partition("..")
                lo, hi = int(a), int(z)
                if hi < lo:
                    raise _Bad("segments", item, "a run A..B needs A <= B")
                ids.extend(range(-(base + lo), -(base + hi) - 1, -1))
                lens.extend([block] * (hi - lo + 1))
            else:
                ids.append(-(base + int(item)))
                lens.append(block)
        except ValueError as exc:
            if isinstance(exc, _Bad):
                raise
            raise _Bad(
                "segments", item, "expected items BLOCK:TOKENS, BLOCK or FIRST..LAST"
            ) from None
    total = sum(lens)
    if total != prompt:
        raise _Bad(
            "segments",
            text if len(text) < 60 else text[:57] + "...",
            f"the segments hold {total} tokens but input_tokens is {prompt}",
        )
    return ids, lens
