"""Trace replay: the five readers, line-numbered errors, scaling, the bundled traces, export ->
replay identity and conversion."""

from __future__ import annotations

import gzip
import itertools
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.simcore import registry
from servesim.simcore.errors import ScenarioError, UnknownPluginError
from servesim.workloads.base import RequestSpec, trace_segment
from servesim.workloads.fields import SLO_CLASSES
from servesim.workloads.traces import (
    BUNDLED_TRACES,
    DATA_DIR,
    TRACE_PRIVATE_BASE,
    TraceWorkload,
    block_reuse,
    convert,
    detect_format,
    load_trace,
    read_trace,
    write_trace,
)

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces"
AZURE_CONV = SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
AZURE_CODE = SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
MOONCAKE_CONV = SHARED / "mooncake_fast25" / "conversation_trace.jsonl"
MOONCAKE_SYNTH = SHARED / "mooncake_fast25" / "synthetic_trace.jsonl"
needs_upstream = pytest.mark.skipif(
    not MOONCAKE_CONV.is_file(), reason="upstream trace copies not present"
)


def row(s: RequestSpec) -> tuple:
    return (
        s.id,
        s.arrival_us,
        s.prompt_tokens,
        s.output_tokens,
        s.prefix_group,
        s.prefix_tokens,
        s.max_output_tokens,
        s.slo_class,
        s.client,
        s.tenant,
        s.segments,
    )


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def error_of(trace, **config) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        read_trace(str(trace), **config)
    return info.value


# --- servesim format -----------------------------------------------------------------------------

SERVESIM = """# servesim-trace v1
# block_tokens: 4
# source: hand-written
arrival_us,input_tokens,output_tokens,max_output_tokens,prefix_group,prefix_tokens,slo_class,client,tenant,segments
10,10,3,,-1,0,critical,chat,acme,0..1 2:2
10,6,2,0,2,5,,"a,b",,
5,3,1,7,-1,0,batch,,t2,-9:3
"""


def test_servesim_format_reads_every_field(tmp_path):
    specs = read_trace(str(write(tmp_path / "t.csv", SERVESIM)))
    assert [row(s) for s in specs] == [
        (0, 5, 3, 1, -1, 0, 7, "batch", "default", "t2", ((trace_segment(-9), 3),)),
        (
            1,
            10,
            10,
            3,
            -1,
            0,
            3,
            "critical",
            "chat",
            "acme",
            ((trace_segment(0), 4), (trace_segment(1), 4), (trace_segment(2), 2)),
        ),
        (2, 10, 6, 2, 2, 5, 0, "standard", "a,b", "", None),
    ]


def test_servesim_metadata_and_reordering_are_described(tmp_path):
    w = TraceWorkload.from_config({"trace": str(write(tmp_path / "t.csv", SERVESIM))})
    d = w.describe()
    assert d["format"] == "servesim" and d["metadata"] == {"source": "hand-written"}
    assert d["out_of_order_rows"] == 1 and d["first_out_of_order_line"] == 7
    assert not d["sorted_in_file"]


@pytest.mark.parametrize(
    "body,line,needle",
    [
        ("arrival_us,input_tokens,output_tokens\n0,5,x\n", 3, "output_tokens"),
        ("arrival_us,input_tokens,output_tokens\n0,5,1\n-3,5,1\n", 4, "negative"),
        ("arrival_us,input_tokens,output_tokens\n0,0,1\n", 3, "at least 1"),
        ("arrival_us,input_tokens,output_tokens\n0,5\n", 3, "expected 3 columns"),
        ("arrival_us,input_tokens\n", 2, "missing column(s) output_tokens"),
        ("arrival_us,input_tokens,output_tokens,tenat\n", 2, "did you mean 'tenant'"),
        ("arrival_us,input_tokens,output_tokens,segments\n0,5,1,1:4\n", 3, "hold 4 tokens"),
        ("arrival_us,input_tokens,output_tokens,segments\n0,5,1,7\n", 3, "block_tokens"),
        ("arrival_us,input_tokens,output_tokens,slo_class\n0,5,1,vip\n", 3, "SLO class"),
        (
            "arrival_us,input_tokens,output_tokens,prefix_group,prefix_tokens\n0,5,1,1,6\n",
            3,
            "exceed",
        ),
    ],
)
def test_servesim_malformed_rows_name_file_and_line(tmp_path, body, line, needle):
    file = write(tmp_path / "bad.csv", "# servesim-trace v1\n" + body)
    err = error_of(file)
    assert err.path == f"{file}:{line}"
    assert needle in str(err)


def test_servesim_format_needs_its_first_line(tmp_path):
    file = write(tmp_path / "t.csv", "arrival_us,input_tokens,output_tokens\n0,5,1\n")
    err = error_of(file, format="servesim")
    assert err.path == f"{file}:1" and "servesim-trace v1" in str(err)


# --- plain CSV -----------------------------------------------------------------------------------


def test_plain_csv_with_prefix_ids(tmp_path):
    file = write(
        tmp_path / "t.csv",
        "arrival_s,input_tokens,output_tokens,prefix_id,prefix_tokens,note\n"
        "0.5,100,10,sys-a,40,x\n"
        "0.25,100,10,,,y\n"
        "1.000001,50,0,sys-b,50,z\n"
        "2,80,5,sys-a,30,\n",
    )
    w = TraceWorkload.from_config({"trace": str(file)})
    specs = list(w.requests())
    assert [(s.arrival_us, s.prefix_group, s.prefix_tokens, s.output_tokens) for s in specs] == [
        (250_000, -1, 0, 10),
        (500_000, 0, 40, 10),
        (1_000_001, 1, 50, 1),  # output 0 read as 1, and counted
        (2_000_000, 0, 30, 5),
    ]
    d = w.describe()
    assert d["ignored_columns"] == ["note"]
    assert d["adjusted"] == {"zero_output_rows": 1}
    assert d["prefix_groups"] == 2


def test_plain_csv_numeric_prefix_ids_keep_their_number(tmp_path):
    file = write(
        tmp_path / "t.csv",
        "arrival_ms,input_tokens,output_tokens,prefix_id,prefix_tokens\n1,9,1,7,4\n2,9,1,3,4\n",
    )
    specs = read_trace(str(file))
    assert [(s.arrival_us, s.prefix_group) for s in specs] == [(1000, 7), (2000, 3)]


@pytest.mark.parametrize(
    "body,path_line,needle",
    [
        ("input_tokens,output_tokens\n1,1\n", 1, "arrival column"),
        ("arrival_s,input_tokens,output_tokens\n0,1,1\nsoon,1,1\n", 3, "arrival_s"),
        ("arrival_s,input_tokens,output_tokens,prefix_id\n", 1, "prefix_tokens column"),
        (
            "arrival_s,input_tokens,output_tokens,prefix_id,prefix_tokens\n0,5,1,,3\n",
            2,
            "prefix_id",
        ),
        ("arrival_s,input_tokens,output_tokens\n0,1.5,1\n", 2, "whole number"),
        ("arrival_s,input_tokens,ouput_tokens\n", 1, "did you mean 'output_tokens'"),
        ("arrival_s,input_tokens,output_tokens\n0,1,1\n0,1,1,1\n", 3, "expected 3 columns"),
        ("arrival_s,input_tokens,output_tokens\n0,1,nan\n", 2, "output_tokens"),
    ],
)
def test_plain_csv_malformed_rows_name_file_and_line(tmp_path, body, path_line, needle):
    file = write(tmp_path / "t.csv", body)
    err = error_of(file, format="csv")
    assert err.path == f"{file}:{path_line}"
    assert needle in str(err)


# --- Azure ---------------------------------------------------------------------------------------

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:46.6805904,10,2
2023-11-16 18:15:46.6805906,10,2
2023-11-16 18:15:50.9951690,396,109
2023-11-17 00:00:00,5,1
"""


def test_azure_wall_clock_becomes_microseconds_since_the_first_request(tmp_path):
    specs = read_trace(str(write(tmp_path / "a.csv", AZURE)))
    assert [s.arrival_us for s in specs] == [
        0,
        0,  # 0.4 µs later: rounds down
        1,  # 0.6 µs later: rounds up
        4_314_579,
        (5 * 3600 + 44 * 60 + 13) * 1_000_000 + 319_410,  # across midnight
    ]
    assert [(s.prompt_tokens, s.output_tokens) for s in specs][:1] == [(374, 44)]


@pytest.mark.parametrize(
    "bad_row,needle",
    [
        ("2023-11-16 18:15:61.0,1,1", "out of range"),
        ("2023-13-16 18:15:46.0,1,1", "TIMESTAMP"),
        ("yesterday,1,1", "TIMESTAMP"),
        ("2023-11-16 18:15:46.0,-4,1", "negative"),
        ("2023-11-16 18:15:46.0,4,", "GeneratedTokens"),
    ],
)
def test_azure_malformed_rows_name_file_and_line(tmp_path, bad_row, needle):
    file = write(tmp_path / "a.csv", AZURE + bad_row + "\n")
    err = error_of(file)
    assert err.path == f"{file}:7" and needle in str(err)


# --- Mooncake ------------------------------------------------------------------------------------


def mooncake_line(t, n_in, n_out, hashes, **extra):
    return json.dumps(
        {"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": hashes, **extra}
    )


def test_mooncake_hash_ids_become_content_segments(tmp_path):
    file = write(
        tmp_path / "m.jsonl",
        "\n".join(
            [
                mooncake_line(0, 1100, 5, [0, 1, 2]),  # 512 + 512 + 76
                mooncake_line(3, 1024, 5, [0, 1]),  # two full blocks
                "",
                mooncake_line(7, 1600, 5, [0, 1, 9], session="s1"),  # 1536 + private 64
                mooncake_line(9, 100, 5, []),  # no hash ids: all private
            ]
        )
        + "\n",
    )
    w = TraceWorkload.from_config({"trace": str(file)})
    specs = list(w.requests())
    b = trace_segment
    assert [s.arrival_us for s in specs] == [0, 3000, 7000, 9000]
    assert specs[0].segments == ((b(0), 512), (b(1), 512), (b(2), 76))
    assert specs[1].segments == ((b(0), 512), (b(1), 512))
    assert specs[2].segments == (
        (b(0), 512),
        (b(1), 512),
        (b(9), 512),
        (b(TRACE_PRIVATE_BASE + 2), 64),  # row 2 of the file (0-based)
    )
    assert specs[3].segments == ((b(TRACE_PRIVATE_BASE + 3), 100),)
    assert all(sum(n for _, n in s.segments) == s.prompt_tokens for s in specs)
    d = w.describe()
    assert d["ignored_columns"] == ["session"]
    assert d["segments"]["segments"] == 10 and d["segments"]["reuse"] == pytest.approx(4 / 10)


def test_mooncake_block_tokens_option(tmp_path):
    file = write(tmp_path / "m.jsonl", mooncake_line(0, 20, 1, [4, 5]) + "\n")
    (spec,) = read_trace(str(file), block_tokens=16)
    assert spec.segments == ((trace_segment(4), 16), (trace_segment(5), 4))
    err = error_of(
        write(tmp_path / "c.csv", "arrival_s,input_tokens,output_tokens\n0,1,1\n"), block_tokens=16
    )
    assert err.path == "workload.block_tokens"


@pytest.mark.parametrize(
    "bad,needle",
    [
        ('{"timestamp": 0, "input_length": 10', "not valid JSON"),
        (mooncake_line(0, 100, 1, [1, 2]), "fills at most 1 blocks"),
        (mooncake_line(-1, 100, 1, [1]), "negative"),
        (mooncake_line(0, 100, 1, [1, -2]), "hash_ids"),
        (mooncake_line(0, 100, "many", [1]), "output_length"),
        ('{"timestamp": 0, "output_length": 1}', "input_length"),
        ("[1, 2]", "JSON object"),
    ],
)
def test_mooncake_malformed_lines_name_file_and_line(tmp_path, bad, needle):
    file = write(tmp_path / "m.jsonl", mooncake_line(0, 10, 1, [0]) + "\n\n" + bad + "\n")
    err = error_of(file)
    assert err.path == f"{file}:3" and needle in str(err)


# --- TraceV2 -------------------------------------------------------------------------------------

V2_HEADER = (
    "trace_version: 3\ntime_unit: microseconds\ncreated_at: 2026-01-02T03:04:05Z\nmode: real\n"
    "warm_up_requests: 2\n"
)
V2_COLUMNS = (
    "request_id,client_id,tenant_id,slo_class,session_id,round_index,prefix_group,prefix_length,"
    "streaming,input_tokens,output_tokens,text_tokens,image_tokens,audio_tokens,video_tokens,"
    "reason_ratio,model,deadline_us,server_input_tokens,arrival_time_us,send_time_us,"
    "first_chunk_time_us,last_chunk_time_us,num_chunks,status,error_message,finish_reason"
)
V2_ROWS = [
    "0,c1,t1,critical,s1,0,sys,50,true,10,5,10,0,0,0,0.0,,0,0,100,0,200,300,5,ok,,stop",
    "1,c2,,,s1,1,,0,false,10,5,10,0,0,0,0.0,,0,123,1000,1500,0,0,0,ok,,",
    "2,c1,t1,batch,,0,sys,50,false,7,0,7,0,0,0,0.0,,0,0,2000,2000,0,0,0,error,boom,",
    "3,c1,t1,,,0,other,20,false,1,1,1,0,0,0,0.0,,0,0,2500,0,0,0,0,ok,,",
]


def write_v2(tmp_path, rows=V2_ROWS, header=V2_HEADER, name="run"):
    write(tmp_path / f"{name}.yaml", header)
    return write(tmp_path / f"{name}.csv", "\n".join([V2_COLUMNS, *rows]) + "\n")


def test_tracev2_reads_what_servesim_models(tmp_path):
    write_v2(tmp_path)
    w = TraceWorkload.from_config({"trace": str(tmp_path / "run.yaml")})
    specs = list(w.requests())
    assert [
        (
            s.arrival_us,
            s.prompt_tokens,
            s.output_tokens,
            s.prefix_group,
            s.prefix_tokens,
            s.slo_class,
            s.client,
            s.tenant,
        )
        for s in specs
    ] == [
        (100, 60, 5, 0, 50, "critical", "c1", "t1"),
        (1500, 123, 5, -1, 0, "standard", "c2", ""),  # send time; server_input_tokens
        (2000, 57, 1, 0, 50, "batch", "c1", "t1"),  # output 0 read as 1
        (2500, 21, 1, 1, 20, "standard", "c1", "t1"),
    ]
    d = w.describe()
    assert d["format"] == "tracev2"
    assert {"deadline_us", "status", "request_id"} <= set(d["ignored_columns"])
    # the conversation columns are read (a fixed replay sends every round at its recorded time)
    assert not {"session_id", "round_index", "last_chunk_time_us"} & set(d["ignored_columns"])
    assert d["session_mode"] == "fixed" and d["sessions"] == {"sessions": 1}
    assert any("warm_up_requests" in note for note in d["notes"])
    assert d["metadata"]["trace_version"] == 3 and d["adjusted"] == {"zero_output_rows": 1}
    assert json.loads(json.dumps(d))["metadata"]["created_at"].startswith("2026-01-02")


@pytest.mark.parametrize("name", ["run.csv", "run.yaml", "run"])
def test_tracev2_is_found_by_header_data_or_prefix(tmp_path, name):
    write_v2(tmp_path)
    assert len(read_trace(str(tmp_path / name))) == 4


def test_tracev2_malformed_rows_and_headers(tmp_path):
    file = write_v2(tmp_path, rows=[V2_ROWS[0], V2_ROWS[1].replace(",123,", ",-123,")])
    err = error_of(file)
    assert err.path == f"{file}:3" and "server_input_tokens" in str(err)
    file = write_v2(tmp_path, rows=[V2_ROWS[0].replace("critical", "vip")], name="b")
    assert error_of(file).path == f"{file}:2"
    file = write_v2(tmp_path, header="time_unit: milliseconds\n", name="c")
    assert "microseconds" in str(error_of(file))
    file = write_v2(tmp_path, header="trace_version: [3\n", name="d")
    assert error_of(file).path.startswith(str(tmp_path / "d.yaml"))


# --- replay options ------------------------------------------------------------------------------


def simple_csv(tmp_path, times_s=(2, 3, 5, 9)):
    lines = ["arrival_s,input_tokens,output_tokens"] + [f"{t},10,4" for t in times_s]
    return write(tmp_path / "s.csv", "\n".join(lines) + "\n")


def test_times_are_kept_by_default_and_start_moves_the_first_arrival(tmp_path):
    file = str(simple_csv(tmp_path))
    assert [s.arrival_us for s in read_trace(file)] == [2e6, 3e6, 5e6, 9e6]
    assert [s.arrival_us for s in read_trace(file, start="0s")] == [0, 1e6, 3e6, 7e6]
    assert [s.arrival_us for s in read_trace(file, start="1ms")] == [1e3, 1.001e6, 3.001e6, 7.001e6]


def test_rate_scale_divides_and_time_scale_multiplies_the_gaps(tmp_path):
    file = str(simple_csv(tmp_path))
    assert [s.arrival_us for s in read_trace(file, start=0, rate_scale=2)] == [0, 5e5, 1.5e6, 3.5e6]
    assert [s.arrival_us for s in read_trace(file, start=0, time_scale=3)] == [0, 3e6, 9e6, 21e6]
    both = read_trace(file, start=0, time_scale=3, rate_scale=3)
    assert [s.arrival_us for s in both] == [0, 1e6, 3e6, 7e6]


def test_request_limit_duration_and_overrides(tmp_path):
    file = str(simple_csv(tmp_path))
    assert [s.id for s in read_trace(file, requests=2)] == [0, 1]
    assert len(read_trace(file, duration="3s")) == 3  # 2, 3, 5 s: within 3 s of the first
    specs = read_trace(file, slo_class="batch", max_output_tokens=2)
    assert {(s.slo_class, s.max_output_tokens) for s in specs} == {("batch", 2)}
    assert {s.max_output_tokens for s in read_trace(file)} == {4}  # oracle by default


def test_unsorted_traces_are_sorted_stably(tmp_path):
    file = write(
        tmp_path / "u.csv",
        "arrival_us,input_tokens,output_tokens\n5,1,1\n3,2,1\n5,3,1\n1,4,1\n3,5,1\n",
    )
    w = TraceWorkload.from_config({"trace": str(file)})
    assert [(s.arrival_us, s.prompt_tokens) for s in w.requests()] == [
        (1, 4),
        (3, 2),
        (3, 5),
        (5, 1),
        (5, 3),
    ]
    d = w.describe()
    assert (d["out_of_order_rows"], d["first_out_of_order_line"]) == (3, 3)


@pytest.mark.parametrize(
    "section,path",
    [
        ({}, "workload.trace"),
        ({"trace": "no-such-trace"}, "workload.trace"),
        ({"trace": "azure-conv", "format": "parquet"}, "workload.format"),
        ({"trace": "azure-conv", "rate_scale": 0}, "workload.rate_scale"),
        ({"trace": "azure-conv", "requests": 0}, "workload.requests"),
        ({"trace": "azure-conv", "slo_class": "vip"}, "workload.slo_class"),
        ({"trace": "azure-conv", "max_output_tokens": -1}, "workload.max_output_tokens"),
        ({"trace": "azure-conv", "rate": 3}, "workload.rate"),
    ],
)
def test_config_errors_name_the_field(section, path):
    with pytest.raises(ScenarioError) as info:
        TraceWorkload.from_config(section)
    assert info.value.path == path


def test_unknown_formats_are_refused_with_the_known_ones(tmp_path):
    file = write(tmp_path / "x.txt", "hello,world\n1,2\n")
    with pytest.raises(ScenarioError, match="tracev2") as info:
        read_trace(str(file))
    assert info.value.path == "workload.format"
    with pytest.raises(ScenarioError, match="mooncake") as info:
        read_trace(str(file), format="nope")
    assert info.value.path == "workload.format"
    with pytest.raises(UnknownPluginError):
        load_trace(str(file), "nope")


def test_formats_are_registered_plugins_and_detected_by_content(tmp_path):
    assert {"servesim", "tracev2", "mooncake", "azure", "csv"} <= set(
        registry.registry("trace_format").names()
    )
    assert detect_format(write(tmp_path / "a.csv", AZURE)) == "azure"
    assert detect_format(simple_csv(tmp_path)) == "csv"
    assert detect_format(write(tmp_path / "m", mooncake_line(0, 1, 1, [0]))) == "mooncake"
    assert detect_format(write_v2(tmp_path)) == "tracev2"
    assert detect_format(DATA_DIR / BUNDLED_TRACES["azure-code"]["file"]) == "servesim"


def test_requests_are_generated_lazily():
    w = TraceWorkload.from_config({"trace": "mooncake-conv"})
    gen = w.requests()
    first = list(itertools.islice(gen, 3))
    assert [s.id for s in first] == [0, 1, 2]
    assert len(w) == 12031


# --- bundled traces ------------------------------------------------------------------------------

BUNDLED_COUNTS = {
    "azure-conv": 19366,
    "azure-code": 8819,
    "mooncake-conv": 12031,
    "mooncake-synthetic": 3993,
}


@pytest.mark.parametrize("name,count", BUNDLED_COUNTS.items())
def test_bundled_traces_load_by_name_with_every_row(name, count):
    w = TraceWorkload.from_config({"trace": name})
    times = w.arrival_times_us()
    assert len(w) == count == BUNDLED_TRACES[name]["rows"]
    assert times[0] == 0 and (np.diff(times) >= 0).all()
    d = w.describe()
    assert d["bundled"] == name and d["license"] in ("CC-BY-4.0", "Apache-2.0")
    assert d["sorted_in_file"] and d["metadata"]["source"].startswith("github.com/")


def test_bundled_data_carries_licences_and_attribution():
    files = {p.name for p in DATA_DIR.iterdir()}
    assert {"LICENSE-CC-BY-4.0.txt", "LICENSE-APACHE-2.0.txt", "README.md"} <= files
    readme = (DATA_DIR / "README.md").read_text(encoding="utf-8")
    for fragment in (
        "b469a113cedca53ddc3bdea71a143dc4b7d8700c",
        "3b5a594133958449a1feaf1c9e0fc1b553e34a28",
        "CC-BY-4.0",
        "Apache-2.0",
        "Splitwise",
        "Changes",
    ):
        assert fragment in readme
    assert sum(p.stat().st_size for p in DATA_DIR.iterdir()) < 3_000_000


@pytest.mark.parametrize("name,reuse", [("mooncake-conv", 0.366), ("mooncake-synthetic", 0.640)])
def test_mooncake_prefix_reuse_matches_the_upstream_readme(name, reuse):
    specs = read_trace(name)
    assert round(block_reuse(specs), 3) == reuse
    assert all(s.segments and sum(n for _, n in s.segments) == s.prompt_tokens for s in specs)
    assert TraceWorkload.from_config({"trace": name}).describe()["segments"]["reuse"] == (
        pytest.approx(block_reuse(specs))
    )


def test_bundled_azure_means_match_the_upstream_readme():
    conv = TraceWorkload.from_config({"trace": "azure-conv"}).describe()
    code = TraceWorkload.from_config({"trace": "azure-code"}).describe()
    assert round(conv["mean_input_tokens"]) == 1155 and round(conv["mean_output_tokens"]) == 211
    assert round(code["mean_input_tokens"]) == 2048 and round(code["mean_output_tokens"]) == 28
    assert 5.5 < conv["mean_rate"] < 5.6 and 2.5 < code["mean_rate"] < 2.6


def test_rate_scale_and_limit_apply_to_bundled_traces():
    w = TraceWorkload.from_config({"trace": "azure-conv", "rate_scale": 4, "requests": 500})
    base = TraceWorkload.from_config({"trace": "azure-conv", "requests": 500})
    assert len(w) == 500
    assert np.abs(w.arrival_times_us() - np.rint(base.arrival_times_us() / 4)).max() == 0


@needs_upstream
@pytest.mark.parametrize(
    "name,upstream",
    [
        ("azure-conv", AZURE_CONV),
        ("azure-code", AZURE_CODE),
        ("mooncake-conv", MOONCAKE_CONV),
        ("mooncake-synthetic", MOONCAKE_SYNTH),
    ],
)
def test_bundled_traces_replay_exactly_like_their_upstream_files(name, upstream):
    assert [row(s) for s in read_trace(name)] == [row(s) for s in read_trace(str(upstream))]


def test_the_whole_azure_conversation_trace_is_read():
    # How fast it is read is measured by bench/run.py (scenario g), not by a wall-clock assert.
    source = str(AZURE_CONV) if AZURE_CONV.is_file() else "azure-conv"
    w = TraceWorkload.from_config({"trace": source})
    assert len(w) == 19366


# --- writing and converting ----------------------------------------------------------------------

labels = st.text(alphabet="abcxyz-_ ,\"'", min_size=1, max_size=6).filter(
    lambda s: not s.startswith("#")
)


@st.composite
def request_specs(draw, tracev2: bool = False):
    n = draw(st.integers(1, 12))
    gaps = draw(st.lists(st.integers(0, 10**7), min_size=n, max_size=n))
    arrivals = np.cumsum(gaps).tolist()
    specs = []
    for i in range(n):
        prompt = draw(st.integers(1, 5000))
        output = draw(st.integers(1, 3000))
        group, prefix = -1, 0
        if draw(st.booleans()):
            group = draw(st.integers(0, 5))
            prefix = draw(st.integers(1, prompt))
        segments = None
        if not tracev2 and draw(st.booleans()):
            cuts = (
                sorted(set(draw(st.lists(st.integers(1, prompt - 1), max_size=4))))
                if prompt > 1
                else []
            )
            bounds = [0, *cuts, prompt]
            ids = draw(
                st.lists(
                    st.one_of(st.integers(0, 50), st.integers(-(2**45), 2**45)),
                    min_size=len(bounds) - 1,
                    max_size=len(bounds) - 1,
                )
            )
            if draw(st.booleans()):  # consecutive full blocks, as Mooncake gives
                ids = [-(1 << 40) - h for h in range(len(ids))]
            segments = tuple((seg, hi - lo) for seg, lo, hi in zip(ids, bounds, bounds[1:]))
        budget = output if tracev2 else draw(st.sampled_from([output, 0, output + 7]))
        specs.append(
            RequestSpec(
                i,
                arrivals[i],
                prompt,
                output,
                group,
                prefix,
                budget,
                draw(st.sampled_from(SLO_CLASSES)),
                draw(st.one_of(st.just("default"), labels)),
                draw(st.one_of(st.just(""), labels)),
                segments,
            )
        )
    return specs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=request_specs(), compress=st.booleans())
def test_servesim_export_then_replay_gives_identical_requests(specs, compress):
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / ("t.csv.gz" if compress else "t.csv")
        write_trace(specs, file)
        assert [row(s) for s in read_trace(str(file))] == [row(s) for s in specs]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=request_specs(tracev2=True))
def test_tracev2_export_then_replay_gives_identical_requests(specs):
    with tempfile.TemporaryDirectory() as tmp:
        result = write_trace(specs, Path(tmp) / "out", format="tracev2")
        assert [Path(f).name for f in result["files"]] == ["out.yaml", "out.csv"]
        assert [row(s) for s in read_trace(str(Path(tmp) / "out"))] == [row(s) for s in specs]


def test_tracev2_export_has_blis_columns_and_header(tmp_path):
    specs = read_trace("azure-code", requests=3)
    write_trace(specs, tmp_path / "x.csv", format="tracev2")
    lines = (tmp_path / "x.csv").read_text().splitlines()
    assert lines[0] == V2_COLUMNS and len(lines) == 4
    header = (tmp_path / "x.yaml").read_text()
    assert "trace_version: 3" in header and "time_unit: microseconds" in header


def test_tracev2_cannot_hold_segments_unless_told_to_drop_them(tmp_path):
    specs = read_trace("mooncake-synthetic", requests=5)
    with pytest.raises(ScenarioError, match="segments"):
        write_trace(specs, tmp_path / "m.yaml", format="tracev2")
    result = write_trace(specs, tmp_path / "m.yaml", format="tracev2", strict=False)
    assert result["dropped"] == {"segments": 5}
    replayed = read_trace(str(tmp_path / "m.yaml"))
    assert [(s.arrival_us, s.prompt_tokens, s.segments) for s in replayed] == [
        (s.arrival_us, s.prompt_tokens, None) for s in specs
    ]


def test_convert_between_formats_preserves_the_requests(tmp_path):
    src = write(
        tmp_path / "m.jsonl",
        "\n".join(mooncake_line(t, 600 + 10 * t, 3, [0, t + 1]) for t in (5, 1, 9)) + "\n",
    )
    original = [row(s) for s in read_trace(str(src))]
    result = convert(src, tmp_path / "m.csv.gz", metadata={"note": "test"})
    assert result["source"]["format"] == "mooncake" and result["rows"] == 3
    assert [row(s) for s in read_trace(str(tmp_path / "m.csv.gz"))] == original
    v2 = convert(tmp_path / "m.csv.gz", tmp_path / "m2.yaml", strict=False)
    assert v2["dropped"] == {"segments": 3}
    convert(tmp_path / "m2.yaml", tmp_path / "m3.csv")
    assert [r[:4] for r in map(row, read_trace(str(tmp_path / "m3.csv")))] == [
        r[:4] for r in original
    ]


def test_compressed_exports_are_byte_reproducible(tmp_path):
    specs = read_trace("mooncake-synthetic", requests=50)
    write_trace(specs, tmp_path / "a.csv.gz")
    write_trace(specs, tmp_path / "b.csv.gz")
    assert (tmp_path / "a.csv.gz").read_bytes() == (tmp_path / "b.csv.gz").read_bytes()
    text = gzip.decompress((tmp_path / "a.csv.gz").read_bytes()).decode()
    assert text.startswith("# servesim-trace v1\n# block_tokens: 512\n")


def test_writer_refuses_inconsistent_specs(tmp_path):
    bad = RequestSpec(0, 0, 10, 1, segments=((1, 4),))
    with pytest.raises(ValueError, match="sum"):
        write_trace([bad], tmp_path / "x.csv")
