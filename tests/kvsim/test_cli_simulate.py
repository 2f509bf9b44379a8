"""`kvsim simulate`: flags, --json keys, timeline CSV, one-line errors with exit 2."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kvsim.cli import main
from kvsim.simulate import SUMMARY_KEYS
from kvsim.traces import default_traces_dir as traces_dir


def run_json(capsys, *argv):
    rc = main(["simulate", *argv, "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    return json.loads(out)


def test_json_has_the_issue_keys(capsys):
    d = run_json(capsys, "--model", "opt-13b", "--workload", "alpaca-like", "--num-requests", "50",
                 "--kv-memory-gib", "2")
    assert set(SUMMARY_KEYS) <= set(d)
    assert d["finished"] == 50 and d["strategy"] == "paged" and d["arrivals"] == "all-at-once"
    assert d["capacity_bytes"] == (2 * 2**30) // (16 * 819200) * 16 * 819200


def test_synthetic_spec_strategy_and_timeline(tmp_path, capsys):
    out = tmp_path / "tl.csv"
    d = run_json(capsys, "--model", "llama-3.1-8b", "--prompt-len", "100", "--output-len", "uniform:1:50",
                 "--num-requests", "20", "--strategy", "pow2", "--num-blocks", "100", "--timeline", str(out),
                 "--arrivals", "poisson:5")
    tl = pd.read_csv(out)
    assert len(tl) == d["steps"] and tl["allocated_bytes"].max() == d["peak_allocated_bytes"]
    assert d["strategy"] == "pow2" and d["num_blocks"] is None


def test_text_output(capsys):
    assert main(["simulate", "--model", "opt-13b", "--workload", "sharegpt-like", "--num-requests", "30",
                 "--prefix-caching", "--system-prompt", "64"]) == 0
    out = capsys.readouterr().out
    assert "token states" in out and "prefix cache" in out and "unlimited" in out


def test_trace_limit_and_arrivals(capsys):
    path = traces_dir() / "AzureLLMInferenceTrace_conv.csv"
    if not path.exists():
        pytest.skip("Azure trace not available")
    d = run_json(capsys, "--model", "llama-3.1-8b", "--trace", str(path), "--limit", "300", "--kv-memory-gib", "40")
    assert d["requests"] == 300 and d["finished"] == 300 and d["arrivals"] == "trace"
    d2 = run_json(capsys, "--model", "llama-3.1-8b", "--trace", str(path), "--limit", "300", "--arrivals",
                  "all-at-once", "--num-blocks", "2000")
    assert d2["arrivals"] == "all-at-once" and d2["steps"] < d["steps"]


def test_mooncake_cli_figure(capsys):
    path = traces_dir() / "mooncake_conversation_trace.jsonl"
    if not path.exists():
        pytest.skip("Mooncake trace not available")
    d = run_json(capsys, "--model", "llama-3.1-8b", "--trace", str(path), "--prefix-caching", "--block-size", "512",
                 "--kv-memory", "unlimited", "--limit", "2000")
    assert d["prefix_query_blocks"] > 0 and 0 < d["prefix_hit_blocks"] < d["prefix_query_blocks"]


BAD = {
    "empty.csv": b"",
    "missing.csv": b"TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,3\n",
    "negative.csv": b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,-3,4\n",
    "nan.csv": b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,nan,4\n",
    "unsorted.csv": b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,3,4\n2023-11-16 18:15:40.00,3,4\n",
    "binary.bin": bytes(range(256)),
    "notes.txt": b"dear diary\ntoday, I wrote no trace\n",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_traces_exit_2_with_one_line(tmp_path, capsys, name):
    p = tmp_path / name
    p.write_bytes(BAD[name])
    rc = main(["simulate", "--model", "opt-13b", "--trace", str(p)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("kvsim: error: ") and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv,match", [
    (["--num-blocks", "10", "--kv-memory-gib", "1"], "only one of"),
    (["--strategy", "oracle", "--prefix-caching"], "paged"),
    (["--prompt-len", "10"], "both --prompt-len and --output-len"),
    (["--prompt-len", "10", "--output-len", "x"], "bad length spec"),
    (["--arrivals", "sometimes"], "bad arrivals"),
    (["--trace", "/nonexistent/trace.csv"], "not found"),
    (["--max-len", "10", "--prompt-len", "100", "--output-len", "10"], "cannot draw"),
])
def test_bad_options_exit_2(capsys, argv, match):
    rc = main(["simulate", "--model", "opt-13b", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and match in err and err.count("\n") == 1


def test_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["simulate", "--model", "opt-13b", "--block-size", "0"])
    assert info.value.code == 2
    with pytest.raises(SystemExit):
        main(["simulate", "--strategy", "best-fit"])
