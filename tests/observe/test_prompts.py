"""Prompts built to token targets: sizes, shared prefixes, calibration, tokenizers."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.observe.prompts import (
    VOCABULARY,
    PromptBuilder,
    Tokenizer,
    fit_correction,
    load_tokenizer,
)
from servesim.simcore.errors import ScenarioError
from servesim.workloads.base import RequestSpec


@settings(max_examples=60, deadline=None)
@given(
    total=st.integers(1, 3000),
    prefix_share=st.floats(0, 1),
    group=st.integers(-1, 5),
)
def test_a_prompt_has_one_word_per_token_and_its_groups_prefix(total, prefix_share, group):
    prefix = int(total * prefix_share) if group >= 0 else 0
    spec = RequestSpec(7, 0, total, 1, prefix_group=group, prefix_tokens=prefix)
    builder = PromptBuilder(seed=3)
    words = builder.prompt(spec).split()
    assert len(words) == total
    if prefix > 0:
        other = RequestSpec(8, 0, total, 1, prefix_group=group, prefix_tokens=prefix)
        other_words = builder.prompt(other).split()
        assert other_words[:prefix] == words[:prefix]  # the group's prefix, word for word
        if total - prefix >= 4:  # then each its own (4 random words: never equal by chance)
            assert other_words[prefix:] != words[prefix:]


def test_requests_without_a_group_differ_from_the_first_word_and_repeat_across_runs():
    specs = [RequestSpec(i, 0, 50, 1) for i in range(40)]
    first = [PromptBuilder(seed=1).prompt(s) for s in specs]
    again = [PromptBuilder(seed=1).prompt(s) for s in specs]
    assert first == again
    assert len(set(first)) == 40
    assert len({p.split()[0] for p in first}) > 20  # mostly different from the first token
    assert all(w in VOCABULARY for p in first for w in p.split())


def test_segments_share_text_where_their_ids_match():
    a = RequestSpec(0, 0, 30, 1, segments=((-11, 20), (-12, 10)))
    b = RequestSpec(1, 0, 30, 1, segments=((-11, 20), (-13, 10)))
    builder = PromptBuilder()
    wa, wb = builder.prompt(a).split(), builder.prompt(b).split()
    assert len(wa) == len(wb) == 30
    assert wa[:20] == wb[:20] and wa[20:] != wb[20:]


def test_warm_up_prompts_share_nothing_with_the_group():
    spec = RequestSpec(0, 0, 40, 1, prefix_group=0, prefix_tokens=30)
    builder = PromptBuilder()
    assert builder.prompt(spec, salt="warm-up 0").split()[:30] != builder.prompt(spec).split()[:30]


def test_the_calibrated_correction_inverts_the_servers_count():
    # a server that counts 5 template tokens plus 1.25 tokens per word
    def server(text: str) -> float:
        return 5 + 1.25 * len(text.split())

    probe = PromptBuilder()
    samples = [(n, server(probe.prompt(RequestSpec(-1, 0, n, 1), salt="p"))) for n in (64, 256)]
    overhead, scale = fit_correction(samples)
    assert (overhead, scale) == pytest.approx((5.0, 1.25))
    builder = probe.calibrated(overhead, scale)
    for target in (40, 100, 1000):
        got = server(builder.prompt(RequestSpec(1, 0, target, 1)))
        assert abs(got - target) <= 1.25  # within one word's worth
    assert "calibrated" in builder.method
    with pytest.raises(ScenarioError, match="--calibrate-ratio"):
        probe.calibrated(3.0, 0.0)
    with pytest.raises(ValueError, match="two sizes"):
        fit_correction([(64, 70), (64, 71)])


def test_a_tokenizer_sizes_prompts_exactly():
    # a stand-in tokenizer: one id per character pair, so words do not map 1:1 to tokens
    def encode(text: str) -> list[int]:
        return [hash(text[i : i + 2]) % 1000 for i in range(0, len(text), 2)]

    texts: dict[int, str] = {}

    def encode_keep(text: str) -> list[int]:
        ids = encode(text)
        for i, token in enumerate(ids):
            texts[token] = text[2 * i : 2 * i + 2]
        return ids

    tok = Tokenizer("pairs", encode_keep, lambda ids: "".join(texts[i] for i in ids), 1000)
    builder = PromptBuilder(tokenizer=tok)
    for total in (1, 17, 300):
        spec = RequestSpec(2, 0, total, 1)
        assert len(encode(builder.prompt(spec))) == total
    assert builder.method == "tokenizer pairs"


def test_no_tokenizer_when_asked_for_none_or_nothing_is_installed(tmp_path):
    assert load_tokenizer("none", "meta-llama/Llama-3.1-8B") is None
    assert load_tokenizer(None, "no-such/model-anywhere") is None
    with pytest.raises(ScenarioError, match="--tokenizer"):
        load_tokenizer(str(tmp_path / "missing.json"), "m")


def test_a_bad_ratio_is_refused_by_name():
    with pytest.raises(ScenarioError, match="--words-per-token"):
        PromptBuilder(words_per_token=0)


def test_servesim_run_never_imports_observe():
    code = (
        "import sys; from servesim.cli import build_parser; build_parser('run'); "
        "print(any(m.startswith('servesim.observe') for m in sys.modules), 'httpx' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
