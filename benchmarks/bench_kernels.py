"""Benchmark paged decode attention against the no-paging limit.

    python benchmarks/bench_kernels.py [--json-out PATH] [--budget-s 270]

On CUDA: Llama-3.1-8B attention shapes (32 query heads, 8 KV heads, head_dim 128,
bf16, block 16), batch in {1, 8, 32, 128} x context in {512, 2048, 8192, 32768}, every
sequence at the full context, blocks scattered by a random permutation. For each combo,
median times (``triton.testing.do_bench``) of

- ``triton``: `kernels.paged_attention(backend="triton", validate=False)` (the index
  checks read the tables, a device sync an engine that built them skips);
- ``torch``: the reference backend (gather + float32 einsum; skipped when the float32
  gather would exceed the memory cap);
- ``sdpa``: ``F.scaled_dot_product_attention`` over the same tokens stored contiguously
  (``[batch, 8, context, 128]``, ``enable_gqa=True``): the no-paging limit;
- ``flex``: FlexAttention's paged attention (`torch.nn.attention.experimental.
  _paged_attention.PagedAttention`, page size 128, the smallest its block mask takes
  comfortably), compiled; skipped cleanly when unavailable, wrong, or out of time budget.

Bandwidth: bytes that must move (K and V of every token of every sequence, the query,
the output) / time, in GB/s and as a fraction of the copy bandwidth measured in the same
run (``dst.copy_(src)`` of 1 GiB, counted as 2 GiB moved: read + write).
Targets (batch >= 32, context >= 4096): >= 85 % of copy bandwidth; within 10 % of sdpa.

On a CPU: small shapes (same heads, float32 as the live engine uses on CPU), torch
backend vs contiguous SDPA with ``time.perf_counter`` medians, plus the Triton
interpreter on one tiny shape to show it runs (not a performance number).

Writes JSON with ``--json-out`` and prints the table last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402
from kvsim.hostinfo import cpu_model  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16  # Llama-3.1-8B attention


def make_inputs(batch, context, dtype, device, seed=0):
    """Paged cache with scattered blocks + the same tokens contiguous (built lazily by caller)."""
    g = torch.Generator(device=device).manual_seed(seed)
    blocks_per_seq = context // BLOCK_SIZE
    num_blocks = batch * blocks_per_seq
    key_cache = torch.randn(num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, device=device, dtype=dtype, generator=g)
    value_cache = torch.randn(num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, device=device, dtype=dtype,
                              generator=g)
    perm = torch.randperm(num_blocks, device=device, generator=g)
    block_tables = perm.view(batch, blocks_per_seq).to(torch.int32)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    query = torch.randn(batch, NUM_HEADS, HEAD_DIM, device=device, dtype=dtype, generator=g)
    return query, key_cache, value_cache, block_tables, seq_lens


def contiguous_kv(cache, block_tables):
    # [num_blocks, bs, kvh, d] -> [batch, kvh, context, d] in logical order
    batch, nb = block_tables.shape
    return cache[block_tables.long()].reshape(batch, nb * BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM).transpose(1, 2).contiguous()


def bytes_moved(batch, context, dtype):
    elem = torch.tensor([], dtype=dtype).element_size()
    kv = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * elem
    q_and_out = 2 * batch * NUM_HEADS * HEAD_DIM * elem
    return kv + q_and_out


def sdpa_fn(query, k, v):
    q4 = query[:, :, None, :]  # [batch, heads, 1, d]
    try:
        F = torch.nn.functional
        F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)
        return lambda: F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)
    except TypeError:  # torch < 2.5: no enable_gqa; expanding K/V would read 4x the bytes
        return None


# ----------------------------------------------------------------------------- CUDA


def flex_paged_fn(query, key_cache, value_cache, block_tables, context, expected):
    """FlexAttention's paged attention over the same tokens (own layout, page size 128).

    Returns (callable, note): callable is None when unavailable or wrong.
    """
    try:
        from torch.nn.attention.experimental._paged_attention import PagedAttention
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except Exception as e:  # noqa: BLE001
        return None, f"unavailable: {type(e).__name__}"
    try:
        page = 128
        batch = query.shape[0]
        device = query.device
        pages_per_seq = context // page
        n_pages = batch * pages_per_seq
        pa = PagedAttention(n_pages, page, batch, device=str(device))
        perm = torch.randperm(n_pages, device=device)
        table = perm.view(batch, pages_per_seq)
        pa.page_table[:, :pages_per_seq] = table
        rows = torch.arange(batch, device=device)[:, None].expand_as(table)
        pa.physical_to_logical[rows, table] = torch.arange(pages_per_seq, device=device).expand_as(table)
        pa.capacity[:] = context
        pa.empty_pages = []
        # Physical flex cache [1, kvh, n_pages * page, d] holding the same logical tokens.
        k_logical = contiguous_kv(key_cache, block_tables)  # [batch, kvh, ctx, d]
        v_logical = contiguous_kv(value_cache, block_tables)
        k_flex = torch.empty(1, NUM_KV_HEADS, n_pages * page, HEAD_DIM, device=device, dtype=key_cache.dtype)
        v_flex = torch.empty_like(k_flex)
        pos = torch.arange(context, device=device)[None, :].expand(batch, context)
        pa.assign(torch.arange(batch, device=device), pos, k_logical, v_logical, k_flex, v_flex)
        del k_logical, v_logical

        def no_mask(b, h, q_idx, kv_idx):
            return kv_idx >= 0

        logical = create_block_mask(no_mask, batch, None, 1, context, device=str(device), BLOCK_SIZE=(128, page))
        block_mask = pa.convert_logical_block_mask(logical)
        score_mod = pa.get_score_mod(None)
        compiled = torch.compile(flex_attention, dynamic=False)
        q4 = query[:, :, None, :]

        def run():
            return compiled(q4, k_flex, v_flex, block_mask=block_mask, score_mod=score_mod, enable_gqa=True)

        got = run()[:, :, 0, :]
        if not torch.allclose(got.float(), expected.float(), rtol=3e-2, atol=3e-2):
            return None, "wrong result, skipped"
        return run, "ok"
    except Exception as e:  # noqa: BLE001
        return None, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"


def copy_bandwidth_cuda(do_bench) -> float:
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src))
    return 2 * n / (ms * 1e-3) / 1e9


def run_cuda(args) -> dict:
    from triton.testing import do_bench as _do_bench

    def do_bench(fn, **kw):
        return _do_bench(fn, return_mode="median", **kw)

    t_start = time.perf_counter()
    dtype = torch.bfloat16
    props = torch.cuda.get_device_properties(0)
    copy_gbs = copy_bandwidth_cuda(do_bench)
    mem_cap = args.mem_cap_gb * 1e9
    torch_ref_cap = args.torch_ref_cap_gb * 1e9
    rows = []
    flex_budget_left = args.flex_budget_s
    for batch in (1, 8, 32, 128):
        for context in (512, 2048, 8192, 32768):
            row = {"batch": batch, "context": context}
            rows.append(row)
            cache_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * 2
            if 2 * cache_bytes > mem_cap:  # paged cache + its contiguous copy
                row["skipped"] = "over memory cap"
                continue
            if time.perf_counter() - t_start > args.budget_s:
                row["skipped"] = "over time budget"
                continue
            q, kc, vc, bt, sl = make_inputs(batch, context, dtype, "cuda")
            moved = bytes_moved(batch, context, dtype)
            row["bytes_moved"] = moved

            def triton_call():
                return kernels.paged_attention(q, kc, vc, bt, sl, backend="triton", validate=False)

            expected = kernels.paged_attention(q, kc, vc, bt, sl, backend="triton")  # validated once
            ms = do_bench(triton_call)
            row["triton_ms"] = ms
            row["triton_gbs"] = moved / (ms * 1e-3) / 1e9
            row["triton_frac_copy"] = row["triton_gbs"] / copy_gbs

            k = contiguous_kv(kc, bt)
            v = contiguous_kv(vc, bt)
            fn = sdpa_fn(q, k, v)
            if fn is not None:
                ref = fn()[:, :, 0, :]
                row["max_abs_diff_vs_sdpa"] = float((ref.float() - expected.float()).abs().max())
                row["sdpa_ms"] = do_bench(fn)
                row["triton_over_sdpa"] = row["triton_ms"] / row["sdpa_ms"]
            del k, v

            # torch reference gathers K and V in float32: 4x the bf16 cache bytes, plus scores.
            if 2 * cache_bytes * 2 <= torch_ref_cap:
                row["torch_ms"] = do_bench(
                    lambda: kernels.paged_attention(q, kc, vc, bt, sl, backend="torch", validate=False), rep=50
                )
            else:
                row["torch_note"] = "skipped: float32 gather over cap"

            if context % 128 == 0 and flex_budget_left > 0:
                t0 = time.perf_counter()
                fn, note = flex_paged_fn(q, kc, vc, bt, context, expected)
                if fn is not None:
                    row["flex_ms"] = do_bench(fn)
                row["flex_note"] = note
                flex_budget_left -= time.perf_counter() - t0
            else:
                row["flex_note"] = "skipped: flex time budget spent"
            del q, kc, vc, bt, sl, expected
            torch.cuda.empty_cache()
    return {
        "device": props.name,
        "num_sms": props.multi_processor_count,
        "dtype": "bfloat16",
        "copy_gbs": copy_gbs,
        "timer": "triton.testing.do_bench median",
        "rows": rows,
        "elapsed_s": time.perf_counter() - t_start,
    }


# ----------------------------------------------------------------------------- CPU


def median_s(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth_cpu() -> float:
    src = torch.empty(64 << 20, dtype=torch.float32)  # 256 MiB
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / median_s(lambda: dst.copy_(src), 5) / 1e9


def run_cpu(args) -> dict:
    t_start = time.perf_counter()
    dtype = torch.float32
    copy_gbs = copy_bandwidth_cpu()
    rows = []
    for batch in (1, 8):
        for context in (512, 2048):
            q, kc, vc, bt, sl = make_inputs(batch, context, dtype, "cpu")
            moved = bytes_moved(batch, context, dtype)
            row = {"batch": batch, "context": context, "bytes_moved": moved}
            out = kernels.paged_attention(q, kc, vc, bt, sl, backend="torch")
            s = median_s(lambda: kernels.paged_attention(q, kc, vc, bt, sl, backend="torch", validate=False), 7)
            row["torch_ms"] = s * 1e3
            row["torch_gbs"] = moved / s / 1e9
            row["torch_frac_copy"] = row["torch_gbs"] / copy_gbs
            k, v = contiguous_kv(kc, bt), contiguous_kv(vc, bt)
            fn = sdpa_fn(q, k, v)
            if fn is not None:
                row["max_abs_diff_vs_sdpa"] = float((fn()[:, :, 0, :] - out).abs().max())
                row["sdpa_ms"] = median_s(fn, 7) * 1e3
                row["torch_over_sdpa"] = row["torch_ms"] / row["sdpa_ms"]
            rows.append(row)
    interp = None
    if kernels.triton_mode() == "triton-interpreter":
        q, kc, vc, bt, sl = make_inputs(1, 128, dtype, "cpu")
        kernels.paged_attention(q, kc, vc, bt, sl, backend="triton")  # first call imports triton
        s = median_s(lambda: kernels.paged_attention(q, kc, vc, bt, sl, backend="triton", validate=False), 3)
        ref = kernels.paged_attention(q, kc, vc, bt, sl, backend="torch")
        got = kernels.paged_attention(q, kc, vc, bt, sl, backend="triton")
        interp = {"batch": 1, "context": 128, "ms": s * 1e3, "max_abs_diff_vs_torch": float((got - ref).abs().max())}
    return {
        "device": f"cpu: {cpu_model()} ({os.cpu_count()} logical cores, torch {torch.get_num_threads()} threads)",
        "dtype": "float32",
        "copy_gbs": copy_gbs,
        "timer": "time.perf_counter median",
        "rows": rows,
        "triton_interpreter": interp,
        "elapsed_s": time.perf_counter() - t_start,
    }


# ----------------------------------------------------------------------------- report


def _fmt(x, spec):
    return format(x, spec) if isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x)) else "-"


def print_table(result: dict) -> None:
    cuda = "num_sms" in result
    main = "triton" if cuda else "torch"
    print(f"\n{result['device']} | {result['dtype']} | copy bandwidth {result['copy_gbs']:.1f} GB/s "
          f"(read+write) | {result['timer']}")
    print(f"Llama-3.1-8B attention: {NUM_HEADS} q heads, {NUM_KV_HEADS} kv heads, head_dim {HEAD_DIM}, "
          f"block {BLOCK_SIZE}; paged backend = {main}")
    cols = ["batch", "context", f"{main} ms", "GB/s", "% copy", "sdpa ms", f"{main}/sdpa"]
    if cuda:
        cols += ["torch ms", "flex ms"]
    print(" ".join(f"{c:>10}" for c in cols))
    for r in result["rows"]:
        if "skipped" in r:
            print(f"{r['batch']:>10} {r['context']:>10}  skipped: {r['skipped']}")
            continue
        vals = [
            _fmt(r["batch"], "d"), _fmt(r["context"], "d"), _fmt(r.get(f"{main}_ms"), ".3f"),
            _fmt(r.get(f"{main}_gbs"), ".1f"), _fmt(100 * r[f"{main}_frac_copy"], ".1f"),
            _fmt(r.get("sdpa_ms"), ".3f"), _fmt(r.get(f"{main}_over_sdpa"), ".2f"),
        ]
        if cuda:
            vals += [_fmt(r.get("torch_ms"), ".3f"), _fmt(r.get("flex_ms"), ".3f")]
        print(" ".join(f"{v:>10}" for v in vals))
    if cuda:
        notes = {r.get("flex_note") for r in result["rows"] if r.get("flex_note") and r.get("flex_note") != "ok"}
        for note in sorted(notes):
            print(f"flex: {note}")
        hits = [r for r in result["rows"] if r["batch"] >= 32 and r["context"] >= 4096 and "triton_ms" in r]
        for r in hits:
            ok_bw = r["triton_frac_copy"] >= 0.85
            ok_sdpa = r.get("triton_over_sdpa", math.inf) <= 1.10
            print(f"target batch {r['batch']} ctx {r['context']}: {100 * r['triton_frac_copy']:.0f}% of copy "
                  f"({'met' if ok_bw else 'MISSED'}), {r.get('triton_over_sdpa', math.nan):.2f}x sdpa "
                  f"({'met' if ok_sdpa else 'MISSED'})")
    elif result.get("triton_interpreter"):
        t = result["triton_interpreter"]
        print(f"triton interpreter (correctness only): batch 1, context 128: {t['ms']:.0f} ms, "
              f"max |diff| vs torch {t['max_abs_diff_vs_torch']:.1e}")
    print(f"elapsed {result['elapsed_s']:.1f} s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json-out", type=Path, help="write the results as JSON here")
    p.add_argument("--budget-s", type=float, default=240.0, help="stop starting new CUDA combos after this")
    p.add_argument("--flex-budget-s", type=float, default=90.0, help="time allowed for FlexAttention compiles")
    p.add_argument("--mem-cap-gb", type=float, default=80.0, help="skip combos whose caches exceed this")
    p.add_argument("--threads", type=int, default=0, help="CPU: torch threads (0 = torch's default)")
    p.add_argument("--torch-ref-cap-gb", type=float, default=24.0, help="skip the torch reference beyond this")
    args = p.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    result = run_cuda(args) if torch.cuda.is_available() else run_cpu(args)
    result.update(torch=torch.__version__, triton_mode=kernels.triton_mode(), python=platform.python_version())
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(result, indent=2))
    print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
