"""lowtime's Phillips–Dessouky solver without the per-step rebuilding of its graph.

``lowtime.solver.PhillipsDessouky.run`` spends almost all of each step outside the algorithm:
it recomputes every operation's earliest/latest times through attrs-validated attribute writes,
copies the whole activity-on-arc DAG into a new networkx graph to drop the non-critical edges,
walks it again for the total time, and sums the cost of every operation through its cost model.
On a 16-stage, 128-microbatch 1F1B DAG (≈ 8,000 operations with the P2P transfers) that is about
1 s per step, and the solver takes one step per time unit it saves.

None of that structure changes between steps: the DAG's topology is fixed and only durations
move. :class:`IncrementalPhillipsDessouky` therefore converts the DAG to activity-on-arc form once
(lowtime's own conversion), keeps the topology as integer arrays, and per step computes

- node times by one forward and one backward longest-path pass over plain integer lists (an
  edge is critical iff ``earliest(u) + duration + tail(v) == total``, lowtime's
  ``earliest_finish == latest_finish`` in integers);
- the flow bounds of the critical edges with lowtime's own formula, from cost-model values
  cached per (cost model, duration);
- the minimum cut, by one of two back ends: lowtime's own Rust core, fed the critical edges in
  the order ``format_rust_inputs`` gives them (nodes without a critical edge left out: they
  carry no flow and are never reached), or :func:`min_cut` (OR-tools, exact integers);
- the duration changes with lowtime's own rule, through each ``Operation``'s ``duration``
  setter (so ``assigned_knob`` follows as in lowtime);
- the total cost as lowtime sums it (every non-dummy operation in edge order).

With lowtime's cut, every yielded :class:`lowtime.solver.IterationResult` and every operation's
duration and knob are identical to ``PhillipsDessouky.run``'s (``tests/test_phillips_dessouky.py``
checks step for step; ``benchmarks/perseus_exact.py`` on the Perseus profiles). With OR-tools'
cut the times are the same and the costs agree to about 1e-9; where two cuts cost the same it may
take the other one (e.g. swap equal-cost clocks between identical stages). What it does not
maintain is each ``Operation``'s ``earliest_*`` / ``latest_*`` fields, which nothing in this
suite reads.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import TYPE_CHECKING, Literal

import networkx as nx
from lowtime.solver import FP_ERROR, IterationResult, PhillipsDessouky

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)

#: lowtime's "infinite" flow capacity (``PhillipsDessouky.annotate_capacities``).
_INF_CAPACITY = 10000.0


#: Minimum-cut back ends: lowtime's Rust core (float, lowtime's own tie-breaking) or OR-tools.
MinCut = Literal["lowtime", "ortools"]


class IncrementalPhillipsDessouky(PhillipsDessouky):
    """:class:`lowtime.solver.PhillipsDessouky` whose ``run`` keeps the DAG's topology between
    steps (see the module docstring).

    Args:
        dag, attr_name: As for lowtime's solver.
        cut: ``"lowtime"`` computes each minimum cut with lowtime's own Rust core, so that
            every step is lowtime's; ``"ortools"`` with :func:`min_cut` (exact integer flows,
            several times faster on large DAGs; where several minimum cuts cost the same it may
            pick another of them, so equal-cost knobs can differ from lowtime's).
    """

    def __init__(self, dag: nx.DiGraph, attr_name: str = "op", cut: MinCut = "lowtime") -> None:
        super().__init__(dag, attr_name)
        if cut not in ("lowtime", "ortools"):
            raise ValueError(f"unknown minimum-cut back end {cut!r}")
        self.cut = cut

    def run(self) -> Generator[IterationResult, None, None]:
        import numpy as np
        from lowtime.graph_utils import aon_dag_to_aoa_dag

        aoa = aon_dag_to_aoa_dag(self.aon_dag, attr_name=self.attr_name)
        node_ids = list(aoa.nodes)
        index = {n: i for i, n in enumerate(node_ids)}
        source, sink = index[aoa.graph["source_node"]], index[aoa.graph["sink_node"]]
        edge_u: list[int] = []
        edge_v: list[int] = []
        ops: list = []
        for u, v, attrs in aoa.edges(data=True):
            edge_u.append(index[u])
            edge_v.append(index[v])
            ops.append(attrs[self.attr_name])
        n_nodes, n_edges = len(node_ids), len(ops)
        out_edges: list[list[int]] = [[] for _ in range(n_nodes)]
        for e, u in enumerate(edge_u):
            out_edges[u].append(e)
        topo = [index[n] for n in nx.topological_sort(aoa)]
        real = [e for e, op in enumerate(ops) if not op.is_dummy]
        for e in real:  # lowtime starts from every operation at its slowest
            ops[e].duration = ops[e].max_duration
        duration = [0 if op.is_dummy else op.duration for op in ops]
        table = _CostTable(ops)
        eu, ev, ids = np.array(edge_u), np.array(edge_v), np.array(node_ids)

        def critical_edges() -> tuple[int, list[int]]:
            earliest = [0] * n_nodes
            for u in topo:
                t_u = earliest[u]
                for e in out_edges[u]:
                    t = t_u + duration[e]
                    if t > earliest[edge_v[e]]:
                        earliest[edge_v[e]] = t
            tail = [0] * n_nodes
            for u in reversed(topo):
                best = 0
                for e in out_edges[u]:
                    t = duration[e] + tail[edge_v[e]]
                    if t > best:
                        best = t
                tail[u] = best
            total = earliest[sink]
            return total, [e for e in range(n_edges)
                           if earliest[edge_u[e]] + duration[e] + tail[edge_v[e]] == total]

        total, critical = critical_edges()
        logger.info("Expected maximum quantized execution time: %d", total)
        for iteration in range(1 << 62):
            crit = np.array(critical, dtype=np.int64)
            lower, upper = table.bounds(crit, np.array(duration)[crit])
            if self.cut == "lowtime":
                in_source = _lowtime_cut(ids, index, eu[crit], ev[crit], lower, upper,
                                         source, sink)
            else:
                in_source = min_cut(eu[crit], ev[crit], lower, upper, source, sink, n_nodes)
            if in_source is None:
                logger.info("Could not find minimum cut: no feasible flow")
                break
            cost_change = self._reduce(crit, eu, ev, in_source, ops, duration, table)
            if cost_change == float("inf") or abs(cost_change) < FP_ERROR:
                break
            total, critical = critical_edges()
            total_cost = 0.0
            for e in real:
                total_cost += table.cost(e, duration[e])
            yield IterationResult(iteration=iteration + 1, cost_change=cost_change,
                                  cost=total_cost, quant_time=total, unit_time=self.unit_time)

    @staticmethod
    def _reduce(crit: "np.ndarray", eu: "np.ndarray", ev: "np.ndarray", in_source: "np.ndarray",
                ops: list, duration: list[int], table: "_CostTable") -> float:
        """``PhillipsDessouky.reduce_durations``: speed up the critical edges from the source
        side to the sink side of the cut by one unit and slow down those going back."""
        tail_in, head_in = in_source[eu[crit]], in_source[ev[crit]]
        speed_up = crit[tail_in & ~head_in].tolist()
        slow_down = crit[~tail_in & head_in].tolist()
        if not speed_up:
            return 0.0
        change = 0.0
        for e in speed_up:
            op = ops[e]
            if op.is_dummy or op.duration - 1 < op.min_duration:
                return float("inf")
            change += abs(table.cost(e, op.duration - 1) - table.cost(e, op.duration))
            op.duration -= 1
            duration[e] = op.duration
        for e in slow_down:
            op = ops[e]
            if op.is_dummy:
                continue
            if op.duration + 1 > op.max_duration:
                return float("inf")
            change -= abs(table.cost(e, op.duration) - table.cost(e, op.duration + 1))
            op.duration += 1
            duration[e] = op.duration
        return change


class _CostTable:
    """Every operation's cost-model value at every duration it can take (J): lowtime's
    ``op.get_cost(d)``, evaluated once per (cost model, duration)."""

    def __init__(self, ops: list) -> None:
        import numpy as np

        base = np.zeros(len(ops), dtype=np.int64)
        offset = np.zeros(len(ops), dtype=np.int64)
        self.lo = np.zeros(len(ops), dtype=np.int64)
        self.hi = np.zeros(len(ops), dtype=np.int64)
        self.dummy = np.array([op.is_dummy for op in ops])
        flat: list[float] = []
        by_model: dict[int, int] = {}
        for e, op in enumerate(ops):
            if op.is_dummy:
                continue
            self.lo[e], self.hi[e] = op.min_duration, op.max_duration
            model = op.spec.cost_model
            key = id(model)
            if key not in by_model:
                by_model[key] = len(flat)
                # One slot either side, never read, keeps the vectorized lookups in range.
                flat.append(0.0)
                flat.extend(op.get_cost(d) for d in range(op.min_duration, op.max_duration + 1))
                flat.append(0.0)
            base[e] = op.min_duration - 1
            offset[e] = by_model[key]
        flat = flat or [0.0, 0.0, 0.0]
        self.flat = np.array(flat)
        self._flat = flat
        self.base, self.offset = base, offset

    def cost(self, e: int, d: int) -> float:
        """Cost of edge ``e``'s operation at duration ``d`` (J)."""
        return self._flat[int(self.offset[e] + d - self.base[e])]

    def bounds(self, edges: "np.ndarray", d: "np.ndarray") -> tuple["np.ndarray", "np.ndarray"]:
        """Flow bounds (lb, ub) of critical edges at durations ``d``, as
        ``PhillipsDessouky.annotate_capacities`` sets them (J), rounded down to ``FP_ERROR``."""
        import numpy as np

        lo, hi, dummy = self.lo[edges], self.hi[edges], self.dummy[edges]
        at = np.where(dummy, 1, self.offset[edges] + d - self.base[edges])  # 1: any valid slot
        here, slower, faster = self.flat[at], self.flat[at + 1], self.flat[at - 1]
        fixed = dummy | ((d == lo) & (d == hi))
        no_faster = ~fixed & (d - 1 < lo)
        no_slower = ~fixed & ~no_faster & (d + 1 > hi)
        inner = ~fixed & ~no_faster & ~no_slower
        lb = np.where(no_faster | inner, np.abs(here - slower), 0.0)
        ub = np.where(fixed | no_faster, _INF_CAPACITY,
                      np.where(no_slower, np.abs(faster - here),
                               np.abs(faster - here) + FP_ERROR))
        return lb // FP_ERROR * FP_ERROR, ub // FP_ERROR * FP_ERROR


def _lowtime_cut(ids: "np.ndarray", index: dict[int, int], tails: "np.ndarray",
                 heads: "np.ndarray", lower: "np.ndarray", upper: "np.ndarray", source: int,
                 sink: int) -> "np.ndarray | None":
    """Source side (a mask over node indices) of lowtime's own minimum cut (its Rust core, fed
    the critical edges in lowtime's order), or ``None`` when lowtime finds no feasible flow.
    ``index`` maps a node id to its index in ``ids``."""
    import numpy as np
    from lowtime import _lowtime_rs
    from lowtime.exceptions import LowtimeFlowError

    touched = np.unique(np.concatenate([tails, heads]))
    edges = [((int(ids[u]), int(ids[v])), (0, 0, float(ub), float(lb)))
             for u, v, lb, ub in zip(tails.tolist(), heads.tolist(), lower.tolist(),
                                     upper.tolist())]
    try:
        runner = _lowtime_rs.PhillipsDessouky(FP_ERROR, ids[touched].tolist(), int(ids[source]),
                                              int(ids[sink]), edges)
        s_set, _ = runner.find_min_cut()
    except LowtimeFlowError:
        return None
    mask = np.zeros(len(ids), dtype=bool)
    mask[[index[n] for n in s_set]] = True
    return mask


def min_cut(tails: "np.ndarray", heads: "np.ndarray", lower: "np.ndarray",
            upper: "np.ndarray", source: int, sink: int, nodes: int) -> "np.ndarray | None":
    """Source side of the minimum cut of a flow network with lower and upper bounds, the cut
    lowtime's Phillips–Dessouky step reads (``PhillipsDessouky.find_min_cut``), or ``None`` when
    no feasible flow exists.

    The procedure is lowtime's: a feasible flow from the lower-bound transformation (a super
    source and sink, and a sink→source arc), then a maximum flow from ``source`` to ``sink`` in
    its residual network, then the nodes reachable from ``source`` in the final residual network.
    That set is the same for every maximum flow (the minimal minimum cut), so the flow algorithm
    does not change it. The bounds come rounded to multiples of lowtime's ``FP_ERROR`` (J), so
    they are exact integers in that unit, and OR-tools' push-relabel max flow (int64) computes
    the cut exactly; lowtime's own Rust core computes it in floats, and is 5–20 times slower on
    the critical subgraphs of a large 1F1B DAG (``benchmarks/solver_scale.py``).

    Args:
        tails, heads: Edge endpoints (node indices).
        lower, upper: Flow bounds of each edge (J per time unit), multiples of ``FP_ERROR``.
        source, sink: Node indices of the DAG's source and sink.
        nodes: Number of nodes (indices are below it).

    Returns:
        A boolean mask over the nodes, true on the source side.
    """
    import numpy as np
    from ortools.graph.python import max_flow

    tail = np.asarray(tails, dtype=np.int64)
    head = np.asarray(heads, dtype=np.int64)
    lb = np.rint(lower / FP_ERROR).astype(np.int64)
    ub = np.rint(upper / FP_ERROR).astype(np.int64)
    n = nodes
    super_source, super_sink = n, n + 1
    need_in = np.bincount(head, weights=lb, minlength=n).astype(np.int64)
    need_out = np.bincount(tail, weights=lb, minlength=n).astype(np.int64)
    total = int(lb.sum())
    # 1. A feasible flow: lower bounds moved to a super source and sink.
    feasible = max_flow.SimpleMaxFlow()
    arcs = feasible.add_arcs_with_capacity(tail, head, ub - lb)
    nodes = np.arange(n, dtype=np.int64)
    fill_in, fill_out = need_in > 0, need_out > 0
    feasible.add_arcs_with_capacity(np.full(int(fill_in.sum()), super_source), nodes[fill_in],
                                    need_in[fill_in])
    feasible.add_arcs_with_capacity(nodes[fill_out], np.full(int(fill_out.sum()), super_sink),
                                    need_out[fill_out])
    feasible.add_arc_with_capacity(sink, source, max(total, 1))
    if feasible.solve(super_source, super_sink) != feasible.OPTIMAL:
        return None
    if feasible.optimal_flow() != total:
        return None
    flow = feasible.flows(arcs) + lb
    # 2. A maximum flow from source to sink in that flow's residual network.
    residual = max_flow.SimpleMaxFlow()
    residual.add_arcs_with_capacity(np.concatenate([tail, head]), np.concatenate([head, tail]),
                                    np.concatenate([ub - flow, flow - lb]))
    if residual.solve(source, sink) != residual.OPTIMAL:
        return None
    # 3. What the source still reaches in the final residual network.
    mask = np.zeros(n, dtype=bool)
    mask[np.asarray(residual.get_source_side_min_cut(), dtype=np.int64)] = True
    return mask
