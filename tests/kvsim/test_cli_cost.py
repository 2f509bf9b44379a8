"""`kvsim cost`: one step's bytes, FLOPs and time, as JSON and as text; mistakes are one line."""

from __future__ import annotations

import json

import pytest

from kvsim.cli import main


def test_weights_only_decode_json(capsys):
    assert main(["cost", "--model", "opt-13b", "--gpu", "a100-40gb", "--context", "1", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    # 12,853,473,280 params x 2 B / 1.555e12 B/s + (819,200 read + 819,200 written) / 1.555e12 (see test_costmodel)
    assert d["weight_bytes"] == 25_706_946_560
    assert d["step_time_s"] == pytest.approx((25_706_946_560 + 1_638_400) / 1.555e12, rel=1e-9)
    assert d["decode_throughput_tokens_per_s"] == pytest.approx(1 / d["step_time_s"])
    assert d["bound"] == "memory" and d["boundary_linear_ridge_tokens"] == 201


def test_batch_and_prefill_text(capsys):
    assert main(["cost", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--batch", "4", "--context", "4096",
                 "--prefill", "512", "--prefill-cached", "128"]) == 0
    out = capsys.readouterr().out
    assert "4 decode sequence(s) at 4,096 tokens + a prefill of 512 tokens after 128 cached" in out
    assert "H100" in out and "ms" in out


@pytest.mark.parametrize("argv", [
    ["cost", "--model", "opt-13b", "--batch", "0"],
    ["cost", "--model", "opt-13b", "--batch", "-2"],
    ["cost", "--model", "opt-13b", "--prefill", "10", "--prefill-cached", "-1"],
    ["cost", "--model", "opt-13b", "--bandwidth-efficiency", "1.5"],
])
def test_mistakes_are_one_line_errors(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvsim: error:") and len(err.strip().splitlines()) == 1


def test_unknown_gpu_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["cost", "--model", "opt-13b", "--gpu", "tpu"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith("kvsim: error:")
