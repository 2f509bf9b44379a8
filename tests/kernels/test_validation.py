"""Caller mistakes raise a one-line TypeError/ValueError before any kernel runs."""

from __future__ import annotations

import pytest
import torch
from paged_cases import make_paged

import kernels


def _decode_args(device):
    paged = make_paged([5, 20], num_kv_heads=2, head_dim=64, block_size=8, dtype=torch.float32, device=device)
    q = torch.randn(2, 4, 64, device=device)
    return dict(query=q, key_cache=paged.key_cache, value_cache=paged.value_cache, block_tables=paged.block_tables,
                seq_lens=paged.seq_lens)


def _table_with(args, row, col, value):
    table = args["block_tables"].clone()
    table[row, col] = value
    return table


MUTATIONS = {
    "query-2d": (ValueError, "3-D", lambda a: {"query": a["query"][0]}),
    "query-float64": (TypeError, "float32, float16 or bfloat16", lambda a: {"query": a["query"].double()}),
    "query-dtype-vs-cache": (TypeError, "differs from the cache dtype", lambda a: {"query": a["query"].half()}),
    "value-shape": (ValueError, "value_cache shape", lambda a: {"value_cache": a["value_cache"][:, :4]}),
    "cache-3d": (ValueError, "num_blocks, block_size", lambda a: {"key_cache": a["key_cache"][0]}),
    "head-dim": (ValueError, "head_dim", lambda a: {"query": torch.randn(2, 4, 32)}),
    "heads-not-multiple": (ValueError, "multiple of num_kv_heads", lambda a: {"query": torch.randn(2, 3, 64)}),
    "table-int64": (TypeError, "block_tables must be int32", lambda a: {"block_tables": a["block_tables"].long()}),
    "seq-lens-int64": (TypeError, "seq_lens must be int32", lambda a: {"seq_lens": a["seq_lens"].long()}),
    "seq-lens-shape": (ValueError, "seq_lens must have shape", lambda a: {"seq_lens": a["seq_lens"][:1]}),
    "num-seqs": (ValueError, "rows", lambda a: {"query": a["query"][:1]}),
    "device": (ValueError, "on meta", lambda a: {"seq_lens": a["seq_lens"].to("meta")}),
    "block-past-cache": (ValueError, r"block_tables\[1, 2\] = 999", lambda a: {"block_tables": _table_with(a, 1, 2, 999)}),
    "negative-block-in-seq": (ValueError, r"block_tables\[0, 0\] = -1", lambda a: {"block_tables": _table_with(a, 0, 0, -1)}),
    "seq-longer-than-table": (ValueError, "exceeds what block_tables covers",
                              lambda a: {"seq_lens": torch.tensor([5, 40], dtype=torch.int32)}),
    "empty-sequence": (ValueError, "at least one token", lambda a: {"seq_lens": torch.tensor([0, 5], dtype=torch.int32)}),
}


@pytest.mark.parametrize("mutation", MUTATIONS.values(), ids=MUTATIONS.keys())
def test_decode_rejects(backend, mutation):
    error, match, change = mutation
    args = _decode_args("cpu")
    args.update(change(args))
    out = None
    if args["query"].dim() == 3 and args["query"].dtype in (torch.float32, torch.float16):
        out = torch.full_like(args["query"], float("nan"))
    with pytest.raises(error, match=match) as info:
        kernels.paged_attention(**args, backend=backend, out=out)
    assert "\n" not in str(info.value)
    if out is not None:
        assert torch.isnan(out).all(), "the output was written although the call was rejected"


def test_decode_option_errors(backend):
    args = _decode_args("cpu")
    q = args["query"]
    cases = [
        (ValueError, "backend must be one of", dict(backend="cuda")),
        (ValueError, "num_splits", dict(num_splits=0)),
        (ValueError, "sliding_window", dict(sliding_window=0)),
        (ValueError, "scale", dict(scale=-1.0)),
        (ValueError, "out shape", dict(out=torch.empty(2, 4, 32))),
        (TypeError, "out dtype", dict(out=q.half())),
    ]
    for error, match, kw in cases:
        kw.setdefault("backend", backend)
        with pytest.raises(error, match=match):
            kernels.paged_attention(**args, **kw)


def test_unread_table_entries_may_be_anything(backend):
    """Entries past a sequence's end (and before its window) are never read, so -1 or junk is fine."""
    args = _decode_args("cpu")
    args["block_tables"] = _table_with(args, 0, 2, 12345)  # seq 0 has 5 tokens: only entry 0 is read
    kernels.paged_attention(**args, backend=backend)
    args["block_tables"] = _table_with(args, 1, 0, -1)  # seq 1 (20 tokens) with a window of 8 reads entries 1-2
    kernels.paged_attention(**args, backend=backend, sliding_window=8)


def test_block_size_must_be_power_of_two():
    cache = torch.zeros(4, 12, 1, 64)
    with pytest.raises(ValueError, match="power of two"):
        kernels.paged_attention(torch.zeros(1, 1, 64), cache, cache, torch.zeros(1, 2, dtype=torch.int32),
                                torch.ones(1, dtype=torch.int32), backend="torch")


def _prefill_args():
    paged = make_paged([10, 6], num_kv_heads=1, head_dim=64, block_size=8, dtype=torch.float32)
    return dict(query=torch.randn(7, 2, 64), key_cache=paged.key_cache, value_cache=paged.value_cache,
                block_tables=paged.block_tables, context_lens=torch.tensor([6, 3], dtype=torch.int32),
                query_start_loc=torch.tensor([0, 4, 7], dtype=torch.int32))


PREFILL_MUTATIONS = {
    "loc-length": (ValueError, "num_seqs \\+ 1", {"query_start_loc": torch.tensor([0, 7], dtype=torch.int32)}),
    "loc-end": (ValueError, "end at total_query_tokens", {"query_start_loc": torch.tensor([0, 4, 6], dtype=torch.int32)}),
    "loc-decreasing": (ValueError, "non-decreasing",
                       {"query_start_loc": torch.tensor([0, 8, 7], dtype=torch.int32), "query": torch.randn(7, 2, 64)}),
    "loc-int64": (TypeError, "query_start_loc must be int32", {"query_start_loc": torch.tensor([0, 4, 7])}),
    "context-negative": (ValueError, "negative", {"context_lens": torch.tensor([-1, 3], dtype=torch.int32)}),
    "too-long": (ValueError, "more than block_tables covers", {"context_lens": torch.tensor([6, 30], dtype=torch.int32)}),
}


@pytest.mark.parametrize("mutation", PREFILL_MUTATIONS.values(), ids=PREFILL_MUTATIONS.keys())
def test_prefill_rejects(backend, mutation):
    error, match, change = mutation
    args = _prefill_args()
    args.update(change)
    out = torch.full_like(args["query"], float("nan"))
    with pytest.raises(error, match=match) as info:
        kernels.paged_prefill(**args, backend=backend, out=out)
    assert "\n" not in str(info.value)
    assert torch.isnan(out).all()
