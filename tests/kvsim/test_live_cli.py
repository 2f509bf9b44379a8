"""`kvsim live`: the --json keys and the must-show figures of the default run, files, errors,
the Triton interpreter backend and a real trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from kvsim.cli import main
from kvsim.timeline import TIMELINE_COLUMNS
from kvsim.traces import default_traces_dir as _traces_dir

REQUIRED_KEYS = {"backend", "device", "steps", "measured_peak_kv_bytes", "predicted_peak_kv_bytes", "max_abs_error",
                 "tokens_match", "preemptions", "tokens_per_s", "ttft_p50_ms", "tpot_p50_ms", "record"}
RECORD_KEYS = {"kvsim_version", "git_commit", "model", "seed", "attention_backend", "precision", "block_size",
               "num_blocks", "pool_bytes", "workload", "hardware", "torch_version", "triton_version"}


def _run_json(capsys, *argv) -> dict:
    assert main(["live", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_default_run_meets_the_must_shows(capsys, tmp_path):
    tl_path, rec_path = tmp_path / "tl.csv", tmp_path / "rec.json"
    d = _run_json(capsys, "--timeline", str(tl_path), "--record", str(rec_path))
    assert REQUIRED_KEYS <= set(d)
    assert d["backend"] == "torch" and d["device"] == "cpu"
    assert d["tokens_match"] is True
    assert d["max_abs_error"] < 1e-4
    assert abs(d["measured_peak_kv_bytes"] - d["predicted_peak_kv_bytes"]) <= 0.05 * d["predicted_peak_kv_bytes"]
    assert d["finished"] == d["requests"] == 16
    assert d["tokens_per_s"] > 0 and d["ttft_p50_ms"] > 0 and d["tpot_p50_ms"] > 0
    rec = d["record"]
    assert RECORD_KEYS <= set(rec)
    assert rec["precision"] == "fp32" and rec["attention_backend"] == "torch"
    assert rec["model"]["num_layers"] == 4 and rec["model"]["seed"] == 0
    assert rec["workload"]["requests"] == 16 and "prompt_tokens" in rec["workload"]
    assert rec["hardware"]["cpu"]
    tl = pd.read_csv(tl_path)
    assert set(tl.columns) <= set(TIMELINE_COLUMNS)
    assert set(tl["source"]) == {"paged", "contiguous"}
    assert json.loads(rec_path.read_text())["record"]["git_commit"] == rec["git_commit"]


def test_text_output(capsys):
    assert main(["live", "--requests", "3", "--prompt-len", "8", "--output-len", "4"]) == 0
    out = capsys.readouterr().out
    assert "peak KV (paged)  measured" in out and "tokens match contiguous: True" in out


def test_small_pool_from_the_cli(capsys):
    d = _run_json(capsys, "--requests", "8", "--num-blocks", "10", "--check-every", "3")
    assert d["preemptions"] > 0 and d["finished"] == 8 and d["tokens_match"] is True
    assert d["max_step_error_bytes"] == 0


def test_samples_flag(capsys):
    # 3 requests of 20-token prompts (not a whole number of 16-token blocks): each forks twice
    # and every sample but the last copies the shared partial block once
    d = _run_json(capsys, "--samples", "3", "--requests", "3", "--prompt-len", "20", "--output-len", "6",
                  "--check-every", "2")
    assert d["samples_per_request"] == 3 and d["record"]["workload"]["samples_per_request"] == 3
    assert d["cow_copies"] == 3 * 2
    assert d["tokens_match"] is True and d["max_step_error_bytes"] == 0 and d["max_abs_error"] < 1e-4
    assert d["output_tokens"] == 3 * 3 * 6 and d["finished"] == 3
    assert d["peak_running"] <= 8  # two requests of three samples fit the default 8 sequences
    assert d["contiguous"]["peak_running"] == d["peak_running"]
    default = _run_json(capsys, "--requests", "3", "--prompt-len", "20", "--output-len", "6")
    assert default["samples_per_request"] == 1 and default["cow_copies"] == 0


@pytest.mark.parametrize("argv, fragment", [
    (["--samples", "0"], "samples per request must be a positive integer, got 0"),
    (["--samples", "-2"], "samples per request must be a positive integer, got -2"),
    (["--samples", "9"], "max running sequences is 8"),
    (["--block-size", "12"], "power of two"),
    (["--num-blocks", "1"], "pool of 1 blocks"),
    (["--prompt-len", "uniform:9:3"], "uniform"),
    (["--workload", "no-such-file.csv"], "unknown workload"),
    (["--layers", "2"], "hand-set model"),
    (["--device", "cuda"], "cuda"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, fragment):
    if "cuda" in argv:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present")
    assert main(["live", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvsim: error: ") and fragment in err and err.count("\n") == 1


def test_triton_interpreter_backend_agrees():
    """The Triton kernels under the CPU interpreter (set before triton is imported: a subprocess)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    argv = [sys.executable, "-m", "kvsim", "live", "--backend", "triton", "--layers", "1", "--heads", "2",
            "--kv-heads", "1", "--head-dim", "8", "--requests", "3", "--prompt-len", "uniform:4:12",
            "--output-len", "uniform:2:5", "--block-size", "4", "--check-every", "2", "--json"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["backend"] == "triton-interpreter"
    assert d["tokens_match"] is True and d["max_abs_error"] < 1e-4 and d["max_step_error_bytes"] == 0


def test_a_real_trace_scaled_to_fit(capsys):
    path = _traces_dir() / "AzureLLMInferenceTrace_conv.csv"
    if not path.exists():
        pytest.skip("traces not present")
    d = _run_json(capsys, "--workload", str(path), "--requests", "6", "--arrivals", "trace", "--max-len", "96",
                  "--check-every", "5")
    assert d["finished"] == 6 and d["tokens_match"] is True and d["max_step_error_bytes"] == 0
    assert d["record"]["workload"]["length_scale"] < 1
    assert d["record"]["workload"]["prompt_tokens"]["max"] <= 96
