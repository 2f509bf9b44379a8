"""Trace readers: every format, the real traces' published statistics, and every kind of
bad file giving one clear TraceError."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvsim.errors import KvsimError
from kvsim.traces import ColumnMapping, TraceError, detect_format, read_trace
from kvsim.traces import default_traces_dir as traces_dir


def real_trace(name: str) -> Path:
    path = traces_dir() / name
    if not path.exists():
        pytest.skip(f"trace {name} not available")
    return path


# ----- the real traces (numbers from the traces' README, computed independently) ---------


@pytest.mark.parametrize("name,rows,prompt_mean,output_mean,timed", [
    ("AzureLLMInferenceTrace_conv.csv", 19366, 1154.7, 211.1, True),
    ("AzureLLMInferenceTrace_code.csv", 8819, 2047.8, 27.9, True),
    ("mooncake_conversation_trace.jsonl", 12031, 12035.1, 342.6, True),
    ("sharegpt_8k_filtered_stats_llama2_tokenizer.csv", 30731, 2340.0, 438.7, False),
])
def test_real_traces_match_published_stats(name, rows, prompt_mean, output_mean, timed):
    w = read_trace(real_trace(name))
    st = w.stats()
    assert st["requests"] == rows
    assert st["mean_prompt_tokens"] == pytest.approx(prompt_mean, abs=0.06)
    assert st["mean_output_tokens"] == pytest.approx(output_mean, abs=0.06)
    assert w.timed is timed


def test_azure_timestamps_are_seconds_from_first_row():
    w = read_trace(real_trace("AzureLLMInferenceTrace_conv.csv"), limit=2)
    # 18:15:46.6805900 -> 18:15:50.9951690
    assert [r.arrival_s for r in w.requests] == pytest.approx([0.0, 4.314579], abs=1e-6)
    assert (w.requests[0].prompt_tokens, w.requests[0].output_tokens) == (374, 44)


def test_mooncake_keeps_hash_ids_and_ms_timestamps():
    w = read_trace(real_trace("mooncake_conversation_trace.jsonl"), limit=3)
    assert w.hash_block_size == 512
    r = w.requests[0]
    assert r.block_hashes[:3] == (0, 1, 2) and len(r.block_hashes) == -(-r.prompt_tokens // 512)


# ----- small files ------------------------------------------------------------------------


AZURE = b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:47.1805900,10,2\n"


def test_detect_format():
    assert detect_format(AZURE.decode()) == "azure"
    assert detect_format('{"timestamp": 0}') == "mooncake"
    assert detect_format("num_prefill_tokens,num_decode_tokens\n1,2") == "sharegpt-stats"
    assert detect_format("a,b\n1,2") == "csv"


def test_uploaded_bytes_and_limit():
    w = read_trace(AZURE, name="upload.csv")
    assert len(w) == 2 and w.requests[1].arrival_s == pytest.approx(0.5)
    assert len(read_trace(AZURE, limit=1)) == 1


def test_generic_csv_with_mapping():
    data = b"t_ms,in,out\n0,5,6\n250,7,8\n"
    w = read_trace(data, mapping=ColumnMapping("in", "out", "t_ms", "ms"))
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in w.requests] == [(0.0, 5, 6), (0.25, 7, 8)]
    untimed = read_trace(data, mapping=ColumnMapping("in", "out"))
    assert not untimed.timed
    with pytest.raises(TraceError, match="not a known trace format"):
        read_trace(data)
    with pytest.raises(TraceError, match="missing column"):
        read_trace(data, mapping=ColumnMapping("prompt", "out"))


@pytest.mark.parametrize("data,match", [
    (b"", "empty"),
    (b"   \n\n", "empty"),
    (b"TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"),
    (b"TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,3\n", "missing column"),
    (AZURE.replace(b",374,", b",-5,"), "at least 1"),
    (AZURE.replace(b",374,", b",,"), "missing or not a number"),
    (AZURE.replace(b",374,", b",nan,"), "missing or not a number"),
    (AZURE.replace(b",374,", b",3.5,"), "whole number"),
    (AZURE.replace(b"18:15:47", b"18:15:40"), "not sorted"),
    (AZURE.replace(b"2023-11-16 18:15:46.6805900", b"yesterday"), "not a date-time"),
    (b"\x00\x01\x02\x03binary", "binary"),
    (b"\xff\xfe\xfa garbage", "not UTF-8"),
    (b'{"timestamp": 0, "input_length": 5}\n', "missing field"),
    (b'{"timestamp": 0, "input_length": 5, "output_length": -1}\n', "whole number >= 1"),
    (b'{"timestamp": 5, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_length": 5, "output_length": 1}\n', "not sorted"),
    (b'{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, 2]}\n', "hash_ids"),
    (b'{"timestamp": 0, "input_length": NaN, "output_length": 1}\n', "must be a number"),
    (b'{"timestamp": 0, \n', "not JSON"),
    (b"num_prefill_tokens,num_decode_tokens\n5,-1\n", "at least 1"),
])
def test_bad_traces_raise_one_line_errors(data, match):
    with pytest.raises(TraceError, match=match) as info:
        read_trace(data, name="bad.trace")
    msg = str(info.value)
    assert "\n" not in msg and "bad.trace" in msg


def test_missing_and_directory_paths(tmp_path):
    with pytest.raises(TraceError, match="not found"):
        read_trace(tmp_path / "nope.csv")
    with pytest.raises(TraceError, match="directory"):
        read_trace(tmp_path)
    with pytest.raises(KvsimError):
        read_trace(AZURE, limit=0)
    with pytest.raises(TraceError, match="unknown trace format"):
        read_trace(AZURE, format="parquet")


def test_a_text_file_is_not_a_trace(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("hello world\nthis is, not a trace, at all\n")
    with pytest.raises(TraceError):
        read_trace(p)
