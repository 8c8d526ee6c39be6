"""Surrogate-model search in the spirit of Kareus: a tree ensemble predicts time and dynamic energy
of every configuration not yet measured, and each round measures a small batch picked by
hypervolume improvement (HVI) of the predicted points, speed and model uncertainty.

Per round (default 8 configurations, shares 40/20/20/20 %):

- **total-energy HVI**: largest predicted improvement of the measured time vs total-energy
  (dynamic + static · time) hypervolume — the front of partitions on the critical path;
- **dynamic-energy HVI**: the same on the time vs dynamic-energy front (partitions off it);
- **fastest**: the lowest predicted times (the high-clock end, where the fronts are steep and the
  model is least accurate);
- **most uncertain**: the largest spread of the ensemble's members (exploration).

HVI picks are greedy within a round: each chosen point joins the front with its predicted value
before the next is scored ("believer" batching), so a batch does not pile onto one spot. The
reference points are 1.1 × the maxima of the initial design; HVs come from
:func:`kareus.frontier.hypervolume`. The initial design is a Latin hypercube on the integer grid
(every clock stratum covered). All measurements go through :meth:`Evaluator.measure`.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from kareus.errors import InputError
from kareus.frontier import hypervolume, pareto_indices
from kareus.search.base import Evaluator, PartitionSpace, SearchResult
from kareus.search.nsga2 import resolve_budget

#: Smallest initial design (and so the smallest budget) the surrogate accepts.
MIN_INITIAL = 8

#: Acquisition shares of one round: total HVI, dynamic HVI, fastest, most uncertain.
SHARES = (0.4, 0.2, 0.2, 0.2)


def _split(n: int, shares: tuple[float, ...]) -> list[int]:
    """``n`` picks divided by ``shares`` (largest remainder; ties to the earlier share)."""
    raw = np.asarray(shares) * n
    out = np.floor(raw).astype(int)
    for i in sorted(range(len(raw)), key=lambda i: (-(raw[i] - out[i]), i))[: n - out.sum()]:
        out[i] += 1
    return [int(x) for x in out]


def _latin_grid(shape: tuple[int, ...], n: int, rng: np.random.Generator) -> NDArray[np.int64]:
    """``n`` grid indices, each dimension stratified into ``n`` equal bins (a Latin hypercube
    rounded onto the integer grid)."""
    cols = []
    for levels in shape:
        u = (rng.permutation(n) + rng.random(n)) / n
        cols.append(np.minimum((u * levels).astype(np.int64), levels - 1))
    return np.stack(cols, axis=1)


class SurrogateSearch:
    """Tree-ensemble surrogate with hypervolume-improvement batch acquisition.

    Args:
        batch: Configurations measured per round.
        n_estimators: Trees in the ensemble (``ExtraTreesRegressor``, bootstrapped, so the
            members disagree away from the data).
        initial_fraction: Initial design as a fraction of the space (at least 8 configurations,
            at most a third of the budget).
    """

    name = "surrogate"

    def __init__(self, batch: int = 8, n_estimators: int = 24,
                 initial_fraction: float = 0.03, kappa: float = 0.0, bootstrap: bool = True,
                 shares: tuple[float, ...] = SHARES, model='et', members=5, gb_trees=50, depth=3) -> None:
        self.kappa = kappa
        self.model = model
        self.members = members
        self.gb_trees = gb_trees
        self.depth = depth
        self.bootstrap = bootstrap
        self.shares = shares
        if batch < 1 or n_estimators < 2:
            raise InputError("surrogate search: batch must be >= 1 and n_estimators >= 2")
        self.batch = batch
        self.n_estimators = n_estimators
        self.initial_fraction = initial_fraction

    def _initial_size(self, space: PartitionSpace, budget: int) -> int:
        want = max(MIN_INITIAL, math.ceil(self.initial_fraction * space.size))
        return max(MIN_INITIAL, min(want, budget // 3))

    def search(self, evaluator: Evaluator, budget: int | None,
               rng: np.random.Generator) -> SearchResult:
        from sklearn.ensemble import ExtraTreesRegressor

        space = evaluator.space
        budget = resolve_budget(space, budget, MIN_INITIAL, "surrogate")
        static_w = evaluator.backend.gpu.static_power_w
        all_idx = space.all_indices()
        features = np.column_stack([space.clocks_mhz[all_idx[:, 0]],
                                    space.comm_sms[all_idx[:, 1]].astype(float),
                                    space.slots[all_idx[:, 2]].astype(float)])
        measured = np.zeros(space.size, dtype=bool)
        t_meas = np.zeros(space.size)
        e_meas = np.zeros(space.size)

        def measure(flat: NDArray[np.int64]) -> None:
            flat = np.asarray(flat, dtype=np.int64)
            t, e = evaluator.measure(all_idx[flat])
            measured[flat] = True
            t_meas[flat] = t
            e_meas[flat] = e

        # ---- initial design: Latin hypercube on the grid, topped up at random if it collides
        n0 = min(self._initial_size(space, budget), budget)
        init = np.unique(space.flat(_latin_grid(space.shape, n0, rng)))
        if init.size < n0:
            rest = np.setdiff1d(np.arange(space.size), init)
            init = np.concatenate([init, rng.choice(rest, n0 - init.size, replace=False)])
        measure(init)
        tot0 = e_meas[init] + static_w * t_meas[init]
        ref_total = (1.1 * t_meas[init].max(), 1.1 * tot0.max())
        ref_dyn = (1.1 * t_meas[init].max(), 1.1 * e_meas[init].max())

        seed = int(rng.integers(2**31 - 1))
        model = ExtraTreesRegressor(n_estimators=self.n_estimators, bootstrap=self.bootstrap,
                                    min_samples_leaf=1, n_jobs=1,
                                    random_state=seed)
        mrng = np.random.default_rng(seed)
        while evaluator.evaluations < budget and not measured.all():
            n = min(self.batch, budget - evaluator.evaluations, int((~measured).sum()))
            done = np.flatnonzero(measured)
            cand = np.flatnonzero(~measured)
            # log targets: both span several-fold; trees fit relative differences evenly
            y = np.column_stack([np.log(t_meas[done]), np.log(e_meas[done])])
            mu, sd = y.mean(axis=0), y.std(axis=0) + 1e-12
            if self.model == "et":
                model.fit(features[done], (y - mu) / sd)
                per_tree = np.stack([m.predict(features[cand]) for m in model.estimators_])
            else:
                from sklearn.ensemble import GradientBoostingRegressor
                mem = []
                for b in range(self.members):
                    bs = mrng.integers(0, done.size, done.size)
                    cols = []
                    for j in range(2):
                        g = GradientBoostingRegressor(n_estimators=self.gb_trees, max_depth=self.depth, learning_rate=0.15, subsample=1.0, random_state=b)
                        g.fit(features[done][bs], ((y - mu) / sd)[bs, j])
                        cols.append(g.predict(features[cand]))
                    mem.append(np.column_stack(cols))
                per_tree = np.stack(mem)
            per_tree = np.exp(per_tree * sd + mu)  # (trees, cand, 2): time, dynamic energy
            tt, ee = per_tree[..., 0], per_tree[..., 1]
            tot = ee + static_w * tt
            lt, le, ltot = np.log(tt), np.log(ee), np.log(tot)
            k = self.kappa
            t_hat = np.exp(lt.mean(0) - k * lt.std(0))
            e_hat = np.exp(le.mean(0) - k * le.std(0))
            tot_hat = np.exp(ltot.mean(0) - k * ltot.std(0))
            spread = lt.std(0) + ltot.std(0)

            picks: list[int] = []  # positions in cand
            free = np.ones(cand.size, dtype=bool)
            q_total, q_dyn, q_fast, q_unc = _split(n, self.shares)
            t_done = t_meas[done]
            picks += self._hvi_picks(q_total, t_hat, tot_hat, free, t_done,
                                     e_meas[done] + static_w * t_done, ref_total)
            picks += self._hvi_picks(q_dyn, t_hat, e_hat, free, t_done, e_meas[done], ref_dyn)
            for _ in range(q_fast):
                picks.append(self._take(np.where(free, t_hat, np.inf), free))
            for _ in range(q_unc):
                picks.append(self._take(np.where(free, -spread, np.inf), free))
            # HVI may run out of improving candidates: fill with the most uncertain
            while len(picks) < n:
                picks.append(self._take(np.where(free, -spread, np.inf), free))
            measure(cand[np.asarray(picks)])
        return evaluator.result()

    @staticmethod
    def _take(score: NDArray[np.float64], free: NDArray[np.bool_]) -> int:
        i = int(np.argmin(score))
        free[i] = False
        return i

    @staticmethod
    def _hvi_picks(count: int, t_hat: NDArray[np.float64], e_hat: NDArray[np.float64],
                   free: NDArray[np.bool_], t_done: NDArray[np.float64],
                   e_done: NDArray[np.float64], ref: tuple[float, float]) -> list[int]:
        """Up to ``count`` free candidates by greedy predicted hypervolume improvement."""
        picks: list[int] = []
        keep = pareto_indices(t_done, e_done)
        ft, fe = t_done[keep], e_done[keep]
        for _ in range(count):
            base = hypervolume(ft, fe, ref)
            # candidates no front point weakly dominates, inside the reference box
            dom = ((ft[None, :] <= t_hat[:, None]) & (fe[None, :] <= e_hat[:, None])).any(axis=1)
            ok = np.flatnonzero(free & ~dom & (t_hat < ref[0]) & (e_hat < ref[1]))
            if ok.size == 0:
                break
            gain = np.array([hypervolume(np.append(ft, t_hat[i]), np.append(fe, e_hat[i]), ref)
                             for i in ok]) - base
            i = int(ok[int(np.argmax(gain))])
            free[i] = False
            picks.append(i)
            ft, fe = np.append(ft, t_hat[i]), np.append(fe, e_hat[i])
        return picks
