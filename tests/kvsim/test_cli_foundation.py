"""`kvsim models|calc|capacity`: the seed figures, JSON keys, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvsim.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_seed_example_json(capsys):
    code, out, _ = run_cli(capsys, "calc", "--layers", "40", "--kv-heads", "40", "--head-dim", "128",
                           "--kv-dtype", "fp16", "--block-size", "16", "--context", "33", "--json")
    data = json.loads(out)
    assert code == 0
    assert (data["bytes_per_token"], data["blocks"], data["slack_tokens"]) == (819_200, 3, 15)
    for key in ("bytes_per_token", "block_bytes", "num_sequences", "blocks", "live_bytes", "allocated_bytes",
                "slack_bytes", "slack_tokens"):
        assert key in data
    assert "reserved_bytes" not in data
    code, out, _ = run_cli(capsys, "calc", "--layers", "40", "--kv-heads", "40", "--head-dim", "128",
                           "--block-size", "16", "--context", "32", "--json")
    data = json.loads(out)
    assert (data["blocks"], data["slack_tokens"]) == (2, 0)


def test_calc_concurrency_and_max_len(capsys):
    code, out, _ = run_cli(capsys, "calc", "--model", "opt-13b", "--context", "100", "--context", "200",
                           "--concurrency", "3", "--max-len", "2048", "--json")
    data = json.loads(out)
    assert data["num_sequences"] == 6
    assert data["reserved_bytes"] == 6 * 2048 * 819_200


def test_python_dash_m_entry_point():
    proc = subprocess.run([sys.executable, "-m", "kvsim", "calc", "--model", "opt-13b", "--context", "33", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and json.loads(proc.stdout)["blocks"] == 3


def test_capacity_json(capsys):
    code, out, _ = run_cli(capsys, "capacity", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--max-len", "8192",
                           "--json")
    data = json.loads(out)
    for key in ("num_blocks", "kv_tokens", "max_concurrency"):
        assert key in data
    assert data["kv_tokens"] == data["num_blocks"] * 16
    code, out, _ = run_cli(capsys, "capacity", "--model", "opt-13b", "--gpu-memory-gib", "40", "--weights-gib", "24",
                           "--reserve-gib", "0", "--gpu-util", "0.9", "--json")
    data = json.loads(out)
    assert data["num_blocks"] == (int(40 * 2**30 * 0.9) - 24 * 2**30) // (16 * 819_200)


def test_models_lists_presets(capsys):
    code, out, _ = run_cli(capsys, "models", "--json")
    data = json.loads(out)
    ids = {m["id"] for m in data["models"]}
    assert {"llama-3.1-8b", "opt-13b", "deepseek-v3", "gemma-3-27b"} <= ids


@pytest.mark.parametrize("argv", [
    ["calc", "--model", "opt-13b", "--block-size", "0"],
    ["calc", "--model", "opt-13b", "--block-size", "-16"],
    ["calc", "--model", "opt-13b", "--block-size", "2.5"],
    ["calc", "--model", "opt-13b", "--context", "abc"],
    ["calc", "--model", "opt-13b", "--context", "0"],
    ["calc", "--layers", "0", "--kv-heads", "8", "--head-dim", "128"],
    ["calc", "--layers", "4", "--kv-heads", "8"],
    ["calc", "--model", "nope"],
    ["calc", "--model", "opt-13b", "--context", "5000", "--max-len", "2048"],
    ["calc"],
    ["capacity", "--model", "llama-3.1-70b", "--gpu", "l4"],
    ["capacity", "--model", "opt-13b", "--gpu-util", "2"],
    ["capacity", "--model", "opt-13b", "--gpu", "tpu"],
])
def test_bad_input_is_one_line_and_nonzero(capsys, argv):
    with pytest.raises(SystemExit) as info:
        code = main(argv)
        raise SystemExit(code)
    out, err = capsys.readouterr()
    assert info.value.code not in (0, None)
    assert err.startswith("kvsim: error: ") and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("content,fragment", [
    ("{broken", "not valid JSON"),
    ('{"num_attention_heads": 8}', "num_hidden_layers"),
    ('{"num_hidden_layers": "x", "num_attention_heads": 8}', "integer"),
])
def test_bad_config_files(tmp_path, capsys, content, fragment):
    path = tmp_path / "config.json"
    path.write_text(content)
    code = main(["calc", "--config", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and err.count("\n") == 1
    code = main(["calc", "--config", str(tmp_path / "missing.json")])
    assert code == 2 and "cannot read" in capsys.readouterr().err


def test_absurd_context_computes_exactly(capsys):
    code, out, _ = run_cli(capsys, "calc", "--model", "opt-13b", "--context", "1000000000000", "--json")
    data = json.loads(out)
    assert data["allocated_bytes"] == 10**12 * 819_200
