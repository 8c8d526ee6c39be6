"""Does causal flash attention run in whole waves? A list-scheduling check of the wave law.

    python benchmarks/attention_tail.py [--sms 108] [--query-blocks 32]

The simulator charges GEMMs ``ceil(tiles / SMs)`` waves of their average tile, and causal
attention the law derived here (``SimulatorBackend.waves``). Causal flash attention's tiles are not uniform: query block ``m`` of a (batch, head) attends to ``m + 1``
key blocks. This script schedules such tiles greedily, in grid order (query block fastest, as
FlashAttention-2's forward grid ``(m_blocks, batch, heads)`` is dispatched), one block per SM at a
time, and compares the makespan with the wave law's:

- **the nanobatch split**: one attention call over ``bh`` (batch x heads) pairs against two calls
  over ``bh / 2`` each (TP8's 16 pairs, the artifact partition's 32): what splitting a microbatch
  costs the attention, scheduled, by whole waves and by the simulator's law (``tiles / SMs`` plus
  the forward tail);
- **SMs lent to a collective**: the makespan on ``SMs - k`` SMs for k = 0..20, scheduled and
  by whole waves of uniform tiles (where whole waves step: 1024 tiles need 10 waves on 103 SMs, 11
  on 102, 12 on 93).

- **the tail** the simulator charges causal attention (``workloads.graph_builder.
  CAUSAL_TAIL_FWD`` and ``CAUSAL_TAIL_BWD``): how far past its even share ``tiles / SMs`` the
  scheduled grid ends, in average tiles, over 16-64 query blocks, 8-128 (batch, head) pairs and
  88-108 SMs; forward blocks do ``m + 1`` key blocks of work (light first), backward key blocks
  ``Q - m`` query blocks (heavy first).

``--overhead`` adds a fixed cost per tile (Q load, epilogue), in units of one key block's work.
Pure arithmetic: no GPU, a few seconds.
"""

from __future__ import annotations

import heapq
import math
import statistics

import click

from kareus.backends.sim import SimulatorBackend
from kareus.graph import ComputeOp
from kareus.hardware.presets import DEFAULT_GPU, get_preset
from workloads.graph_builder import attention_op


def makespan(work: list[float], sms: int) -> float:
    """Finish time of ``work`` (per tile, dispatched in order to the first free SM) on ``sms``
    SMs, one tile per SM at a time."""
    free = [0.0] * sms
    for w in work:
        heapq.heappush(free, heapq.heappop(free) + w)
    return max(free)


def causal_tiles(pairs: int, query_blocks: int, overhead: float, backward: bool = False
                 ) -> list[float]:
    """Work of each tile of a causal attention grid in dispatch order (block index fastest):
    forward query block ``m`` does ``m + 1`` key blocks, backward key block ``m`` serves
    ``query_blocks - m`` query blocks."""
    ramp = [query_blocks - m if backward else m + 1 for m in range(query_blocks)]
    return [w + overhead for _ in range(pairs) for w in ramp]


def _attention(pairs: int, query_blocks: int) -> ComputeOp:
    """The simulator's causal attention forward over ``pairs`` (batch, head) pairs."""
    seq = 128 * query_blocks
    return attention_op("attention", pairs, 1, 1, 64, seq, seq)


def tail(work: list[float], sms: int) -> float:
    """How far past its even share the scheduled grid ends, in average tiles."""
    return (makespan(work, sms) - sum(work) / sms) / (sum(work) / len(work))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--sms", default=108, show_default=True, type=click.IntRange(min=1),
              help="SMs of the GPU (A100: 108).")
@click.option("--query-blocks", default=32, show_default=True, type=click.IntRange(min=1),
              help="Query blocks per (batch, head): sequence / 128.")
@click.option("--overhead", default=2.0, show_default=True, type=click.FloatRange(min=0),
              help="Fixed work per tile, in key-block units.")
def main(sms: int, query_blocks: int, overhead: float) -> None:
    sim = SimulatorBackend(get_preset(DEFAULT_GPU).with_overrides(sms=sms))
    print("== The nanobatch split: two calls over half the (batch, head) pairs / one call")
    for pairs in (16, 24, 32, 48, 64):
        whole = causal_tiles(pairs, query_blocks, overhead)
        half = causal_tiles(pairs // 2, query_blocks, overhead)
        scheduled = 2 * makespan(half, sms) / makespan(whole, sms)
        tiles = len(whole)
        waves = 2 * math.ceil(tiles / 2 / sms) / math.ceil(tiles / sms)
        law = 2 * sim.waves(_attention(pairs // 2, query_blocks), sms) \
            / sim.waves(_attention(pairs, query_blocks), sms)
        print(f"{pairs:3d} pairs ({tiles:5d} tiles): scheduled {scheduled:.3f}, "
              f"whole waves {waves:.3f}, the simulator's tail law {law:.3f}")
    print("\n== The tail past the even share (average tiles), over 16-64 query blocks, "
          "8-128 pairs, 88-108 SMs")
    for backward in (False, True):
        tails = [tail(causal_tiles(pairs, q, overhead, backward), n)
                 for q in (16, 32, 64) for pairs in (8, 12, 16, 24, 32, 48, 64, 96, 128)
                 for n in (88, 96, 99, 104, 108) if pairs * q >= n]
        print(f"{'backward' if backward else 'forward ':8s}: mean {statistics.mean(tails):.3f}, "
              f"sd {statistics.pstdev(tails):.3f}, {min(tails):.3f}-{max(tails):.3f} "
              f"over {len(tails)} grids")
    lent = min(20, sms - 1)  # at least one SM stays with the attention
    print(f"\n== SMs lent to a collective: time on {sms} - k SMs / time on {sms}, k 0-{lent}")
    work = causal_tiles(32, query_blocks, overhead)
    base = makespan(work, sms)
    n = len(work)
    print(" k  causal, scheduled  uniform, whole waves")
    for k in range(lent + 1):
        print(f"{k:2d}  {makespan(work, sms - k) / base:17.3f}  "
              f"{math.ceil(n / (sms - k)) / math.ceil(n / sms):20.3f}")


if __name__ == "__main__":  # one-line errors and exit statuses, as the kareus commands
    from kareus.exit_status import run_command

    raise SystemExit(run_command(main, None, "attention_tail.py"))
