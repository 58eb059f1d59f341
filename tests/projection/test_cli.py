"""``servesim project``: the table, the ``--json`` document and the inputs it refuses by name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from servesim.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

TOP_LEVEL = {
    "projection_version": int,
    "scenario": str,
    "model": str,
    "instances": int,
    "rate_rps": float,
    "sustainable": bool,
    "limit": str,
    "max_rate_rps": float,
    "max_rate_limit": str,
    "utilization": float,
    "ttft_mean_ms": float,
    "tpot_mean_ms": float,
    "itl_mean_ms": float,
    "e2e_mean_ms": float,
    "responses_per_sec": float,
    "tokens_per_sec": float,
    "input_tokens_per_sec": float,
    "concurrency": float,
    "max_concurrency": float,
    "confidence": dict,
    "workload": dict,
    "groups": list,
    "cpu_ms": float,
}
GROUP = {
    "group": int,
    "instances": int,
    "gpu": str,
    "tp": int,
    "latency": str,
    "kv_blocks": int,
    "kv_tokens": int,
    "max_num_seqs": int,
    "rate_rps": float,
    "sustainable": bool,
    "limit": str,
    "step_ms": float,
    "decode_batch": float,
    "running": float,
    "prefill_utilization": float,
    "budget_utilization": float,
    "kv_utilization": float,
    "prefill_ms": float,
    "prefill_queue_ms": float,
    "ttft_mean_ms": float,
    "tpot_mean_ms": float,
    "e2e_mean_ms": float,
    "max_rate_rps": float,
    "max_rate_limit": str,
    "max_concurrency": float,
    "concurrency_limit": int,
    "confidence": dict,
}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _check_types(doc: dict, schema: dict, nullable: set[str] = frozenset()) -> None:
    assert set(doc) == set(schema)
    for key, kind in schema.items():
        if doc[key] is None and key in nullable:
            continue
        assert isinstance(doc[key], kind) or (kind is float and isinstance(doc[key], int)), key


def test_json_has_the_documented_fields_and_types(capsys):
    code, out, _ = run(capsys, "project", "--rate", "10", "--json")
    assert code == 0
    doc = json.loads(out)
    _check_types(doc, TOP_LEVEL)
    _check_types(doc["groups"][0], GROUP)
    assert doc["confidence"] == {
        "level": "measured",
        "rank": 4,
        "detail": doc["confidence"]["detail"],
    }
    assert doc["sustainable"] and doc["tokens_per_sec"] == pytest.approx(
        10 * doc["workload"]["output"]
    )


def test_json_of_an_overload_has_nulls_where_there_is_no_steady_state(capsys):
    code, out, _ = run(capsys, "project", "--rate", "1000", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["sustainable"] is False and doc["limit"] != "none"
    for key in ("ttft_mean_ms", "tpot_mean_ms", "e2e_mean_ms", "concurrency"):
        assert doc[key] is None
    nullable = {"ttft_mean_ms", "tpot_mean_ms", "itl_mean_ms", "e2e_mean_ms", "concurrency"}
    _check_types(doc, TOP_LEVEL, nullable)
    assert doc["responses_per_sec"] == pytest.approx(doc["max_rate_rps"])


def test_the_table_names_the_quantities_with_units_and_the_cpu_time(capsys):
    code, out, _ = run(
        capsys, "project", "--model", "qwen3-14b", "--gpu", "H100", "--tp", "1", "--rate", "10"
    )
    assert code == 0
    for text in ("TTFT", "TPOT/ITL", " ms", "req/s", "output tok/s", "KV", "max rate", "cpu"):
        assert text in out, text
    assert "confidence measured" in out


def test_a_scenario_file_projects_like_its_flags(capsys):
    code, out, _ = run(capsys, "project", str(EXAMPLES / "default.yaml"), "--json")
    assert code == 0
    assert json.loads(out)["model"] == "qwen3-14b"


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        ([str(EXAMPLES / "pd-disaggregation.yaml")], "cluster.pools"),
        ([str(EXAMPLES / "sessions.yaml")], "workload.sessions"),
        ([str(EXAMPLES / "multi-client.yaml")], "workload.stages"),
        (["--trace", "mooncake-conv"], "workload"),
        (
            ["--set", "engine.speculative={draft_tokens: 2, acceptance_rate: 0.6}"],
            "engine.speculative",
        ),
        (["--set", "engine.prefill_first=true"], "engine.prefill_first"),
        (
            [
                "--set",
                "engine.pp=2",
                "--model",
                "llama-3.1-70b-instruct",
                "--tp",
                "2",
                "--latency-model",
                "trained-physics",
            ],
            "engine.pp",
        ),
        (["--rate", "-3"], "workload.rate"),
    ],
)
def test_what_it_cannot_project_is_refused_by_name(capsys, argv, field):
    code, out, err = run(capsys, "project", *argv)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}"), err


def test_the_howto_python_snippet_runs(monkeypatch, capsys):
    page = (EXAMPLES.parent / "docs" / "howto" / "project.md").read_text(encoding="utf-8")
    (snippet,) = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)
    monkeypatch.chdir(EXAMPLES.parent)
    exec(compile(snippet, "docs/howto/project.md", "exec"), {})
    first, second = capsys.readouterr().out.splitlines()
    assert first.split()[-1] == "measured" and float(second) > 0
