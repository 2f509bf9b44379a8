"""Live mode: a small Llama-style model decoding through a real paged KV cache.

Imports torch (the rest of kvsim does not). Pieces, one concept per module:

- :mod:`kvsim.live.model`: the decoder (RMSNorm, rotary, GQA, SwiGLU; seeded random weights);
- :mod:`kvsim.live.cache`: the NaN-poisoned KV pool and per-request reservations, measured
  from the tensors;
- :mod:`kvsim.live.engine`: the paged engine (BlockPool + kernels), the step loop;
- :mod:`kvsim.live.contiguous`: the max-length reservation baseline;
- :mod:`kvsim.live.sampling`: the next token of each sample (greedy sample 0, seeded sampling);
- :mod:`kvsim.live.requests`: workloads -> token prompts, lengths scaled to fit;
- :mod:`kvsim.live.metrics`, :mod:`kvsim.live.record`: TTFT/TPOT/throughput, the run record;
- :mod:`kvsim.live.run`: :func:`run_live`, both engines over one workload, for the CLI and the page.
"""

from kvsim.live.engine import EngineConfig, EngineRun, PagedEngine
from kvsim.live.model import LIVE_SIZES, LiveModel, LiveModelConfig, scaled_config
from kvsim.live.run import LiveResult, LiveSettings, default_num_blocks, run_live

__all__ = [
    "EngineConfig", "EngineRun", "PagedEngine", "LIVE_SIZES", "LiveModel", "LiveModelConfig", "scaled_config",
    "LiveResult", "LiveSettings", "default_num_blocks", "run_live",
]
