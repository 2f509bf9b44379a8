"""`kvsim simulate --gpu`: the time model's JSON keys, and the issue's check through the CLI:
on the ShareGPT-like workload, OPT-13B on an A100 40GB, paged keeps a low normalized
latency at request rates where reserve-max's has exploded."""

from __future__ import annotations

import json

import pytest

from kvsim.cli import main
from kvsim.costmodel import CostModel
from kvsim.gpus import get_gpu
from kvsim.ratesweep import DEFAULT_LATENCY_FACTOR, sustained_rate, unloaded_normalized_latency
from kvsim.spec import get_preset

KEYS = ("throughput_tokens_per_s", "ttft_p50_s", "tpot_p50_s", "normalized_latency_p50_s")


def _run(capsys, *args: str) -> dict:
    assert main(["simulate", "--model", "opt-13b", "--gpu", "a100-40gb", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_gpu_adds_the_timing_keys_and_the_gpu_kv_budget(capsys):
    d = _run(capsys, "--workload", "sharegpt-like", "--num-requests", "40", "--arrivals", "poisson:1")
    for key in KEYS:
        assert isinstance(d[key], float) and d[key] > 0
    # A100 40GB: 0.9 x 40,960 MiB - 25,706,946,560 B of bf16 weights - 1 GiB = 11,873,484,800 B
    assert d["capacity_bytes"] == 905 * 16 * 819_200  # whole blocks of that budget
    assert 905 * 16 * 819_200 <= int(0.9 * 40960 * 2**20) - 25_706_946_560 - 2**30 < 906 * 16 * 819_200
    assert d["gpu"] == "A100 40GB (SXM)"
    # Light load: a token every decode step, so TPOT is about one OPT-13B decode on the A100 (~16.5 ms + KV).
    assert 0.0165 < d["tpot_p50_s"] < 0.03


def test_without_gpu_no_timing_keys(capsys):
    assert main(["simulate", "--model", "opt-13b", "--num-requests", "20", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert "ttft_p50_s" not in d or d["ttft_p50_s"] is None


def test_unknown_gpu_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--model", "opt-13b", "--gpu", "b300"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("kvsim: error:") and "b300" in err and len(err.strip().splitlines()) == 1


def test_paged_sustains_a_higher_rate_than_reserve_max_via_the_cli(capsys):
    rates = [1.0, 2.0, 3.0]
    mean_latency: dict[str, list[float]] = {"paged": [], "reserve-max": []}
    for strategy in mean_latency:
        for rate in rates:
            d = _run(capsys, "--workload", "sharegpt-like", "--num-requests", "200", "--arrivals", f"poisson:{rate:g}",
                     "--strategy", strategy)
            assert d["finished"] == 200
            mean_latency[strategy].append(d["normalized_latency_mean_s"])
    model = CostModel(get_preset("opt-13b"), get_gpu("a100-40gb"))
    # Bound: 5x a lone request of the paper's mean ShareGPT lengths (161 in, 338 out) on the idle GPU.
    bound = DEFAULT_LATENCY_FACTOR * unloaded_normalized_latency(model, 161, 338)
    paged, _ = sustained_rate(rates, mean_latency["paged"], bound)
    rmax, _ = sustained_rate(rates, mean_latency["reserve-max"], bound)
    assert rmax is not None and paged is not None and paged > rmax
    for i in (1, 2):  # 2 and 3 req/s: reserve-max over the bound, paged within it
        assert mean_latency["reserve-max"][i] > bound >= mean_latency["paged"][i]
