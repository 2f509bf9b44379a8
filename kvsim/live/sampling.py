"""Which token each sample of a request takes (parallel sampling, ``n`` samples per request).

- Sample 0 is greedy (the arg-max of the logits), so a request of one sample decodes
  exactly as before and sample 0 of ``n`` is what a single-sample run would produce.
- Sample ``i >= 1`` draws from ``softmax(logits / TEMPERATURE)`` with the exponential race
  (Gumbel-max): ``argmax(logits / T - log E)``, ``E`` one Exp(1) draw per vocabulary entry
  (float64, on the CPU) from its own ``torch.Generator`` seeded from ``(seed, request_id,
  i)``. Both engines create the generator at the fork (right after the prompt's prefill)
  and draw in token order, so for the same logits they draw the same tokens, and a request
  restarted after a preemption draws the same tokens again.

Why a race, not an inverse CDF: the two engines' fp32 logits differ by ~1e-5 (batching,
kernels). An inverse CDF flips a token when the uniform falls within the cumulative
error of *any* of the vocabulary's boundaries; the race flips only when the two best
perturbed scores are that close, the same near-tie risk as greedy decoding.

The random weights give fairly flat logits, so samples diverge within a few tokens.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

TEMPERATURE = 1.0  # of samples 1..n-1 (sample 0 is greedy)


def sample_seed(seed: int, request_id: int, sample: int) -> int:
    """A 63-bit seed for sample ``sample`` of request ``request_id``."""
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(request_id), int(sample)]).generate_state(2)
    return (int(state[0]) << 31 | int(state[1]) >> 1) & 0x7FFF_FFFF_FFFF_FFFF


def sample_generator(seed: int, request_id: int, sample: int) -> torch.Generator | None:
    """The generator of a sampled sample; None for sample 0 (greedy)."""
    if sample == 0:
        return None
    gen = torch.Generator(device="cpu")
    gen.manual_seed(sample_seed(seed, request_id, sample))
    return gen


def choose_tokens(logits: torch.Tensor, rows: Sequence[int], gens: Sequence[torch.Generator | None]) -> list[int]:
    """The next token for each ``(row of logits, generator)``: arg-max where the generator
    is None, else one seeded exponential-race draw at :data:`TEMPERATURE`."""
    if not rows:
        return []
    greedy = logits.argmax(dim=-1).tolist()
    out = [greedy[r] for r in rows]
    sampled = [j for j, g in enumerate(gens) if g is not None]
    if sampled:
        picked = sorted({rows[j] for j in sampled})
        where = {r: k for k, r in enumerate(picked)}
        scaled = logits[picked].double().cpu() / TEMPERATURE
        vocab = scaled.shape[-1]
        for j in sampled:
            e = -torch.log1p(-torch.rand(vocab, dtype=torch.float64, generator=gens[j]))  # Exp(1)
            out[j] = int(torch.argmax(scaled[where[rows[j]]] - torch.log(e)))
    return out


__all__ = ["TEMPERATURE", "sample_seed", "sample_generator", "choose_tokens"]
