"""The cost model lowtime's solver runs on: each instruction type's options as effective energy
(J) against quantized time, fitted as Perseus's driver fits it (lowtime's ``ExponentialModel``,
``a·exp(b·t) + c``) and, where that fit fails, by the same form fitted here or the options' lower
convex hull (:func:`fit_exponential_model`)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from lowtime.cost_model import CostModel
    from lowtime.operation import CandidateExecutionOptions
    from numpy.typing import NDArray

#: lowtime's exponential fit is tried on an instruction type's options only where the fastest
#: option's quantized time is at most this many times their spread (fit_exponential_model). Its
#: grid search fits ``a·exp(b·t) + c`` in absolute time from ``a`` ≤ 1000: options that change
#: over a spread small beside their time need ``a`` of ``e^(ratio·b·spread)``, e^30 and more
#: past this ratio, which its curve fits reach slowly (seconds per type, up to 50,000
#: evaluations per guess) or not at all. The authors' driver, the paper's suite and the shared
#: profiles stay below 7.
LOWTIME_TIME_TO_SPREAD = 10.0


def fit_exponential_model(cand: CandidateExecutionOptions[int]) -> CostModel:
    """``lowtime``'s ``ExponentialModel`` (``a·exp(b·t) + c``) for candidate options.

    First exactly as the reference driver does (lowtime's own grid search over initial guesses,
    the best fit kept), if that fit is usable: finite, never rising with time and closer to the
    options' costs than their mean is (:func:`_fits`). lowtime rejects fits whose parameter covariance is
    infinite, which happens when three or fewer options are fitted exactly, and its grid assumes
    costs of tens to thousands of J at quantized times of tens to hundreds: at thousands of
    units (a job whose instructions take seconds, e.g. one whose collectives cross a slow
    network) ``exp(b·t)`` overflows or its first guess is kept unchanged; and on options whose
    spread is small beside their time (their time over :data:`LOWTIME_TIME_TO_SPREAD` times
    their spread: a fine unit on a small model) it spends seconds per fit, so it is not tried
    there. Then the same model is
    fitted here in time shifted to the fastest option, ``a·exp(b·(t − t₀)) + c``: ``c`` just below
    the least cost and ``a``, ``b`` from a line through ``log(cost − c)``, refined by least
    squares; with two options, a near-flat exponential through both; with one, a constant. Where
    no exponential fits either (costs that fall and rise again), the options' lower convex hull,
    interpolated linearly, is the model.
    """
    import numpy as np
    from lowtime.cost_model import ExponentialModel
    from scipy.optimize import curve_fit

    t = np.array([o.quant_time for o in cand.options], dtype=np.float64)
    e = np.array([o.cost for o in cand.options], dtype=np.float64)
    if t.min() <= LOWTIME_TIME_TO_SPREAD * np.ptp(t):
        try:
            with warnings.catch_warnings():  # lowtime's grid search warns for each rejected guess
                warnings.simplefilter("ignore")
                model = ExponentialModel(cand, search_strategy="best")
            if _fits(model, t, e):
                return model
        except (ValueError, RuntimeError, TypeError):  # TypeError: fewer points than parameters
            pass
    t0 = float(t.min())
    s = t - t0
    fn = lambda x, a, b, c: a * np.exp(b * x) + c  # noqa: E731 - lowtime's form, shifted
    if len(t) == 1:
        return _exponential((0.0, 0.0, float(e[0])))
    if len(t) == 2:
        b = -1e-3
        a = (e[0] - e[1]) / (np.exp(b * s[0]) - np.exp(b * s[1]))
        model = _exponential((float(a), b, float(e[0] - a * np.exp(b * s[0]))), t0)
        return model if _fits(model, t, e) else _lower_hull(t, e)
    c0 = e.min() - 0.05 * (np.ptp(e) + 1e-9)
    slope, intercept = np.polyfit(s, np.log(e - c0), 1)
    guess = (float(np.exp(intercept)), float(slope), float(c0))
    try:
        with warnings.catch_warnings():  # an exact fit has no covariance estimate
            warnings.simplefilter("ignore")
            fitted = curve_fit(fn, s, e, p0=guess, maxfev=50000)[0]
    except (ValueError, RuntimeError):
        return _lower_hull(t, e)
    model = _exponential((float(fitted[0]), float(fitted[1]), float(fitted[2])), t0)
    return model if _fits(model, t, e) else _lower_hull(t, e)


def _fits(model: CostModel, t: NDArray[np.float64], e: NDArray[np.float64]) -> bool:
    """Whether the cost ``model`` is usable for options at quantized times ``t`` costing ``e``
    (J): finite at each, never rising with time between the fastest and the slowest option (on
    a grid of at most about a thousand points; the solvers charge a speed-up the cost it adds),
    and its squared error no larger than that of the costs' mean."""
    import numpy as np

    grid = np.unique(np.concatenate([t, np.linspace(t.min(), t.max(), 1001)]).astype(np.int64))
    with np.errstate(all="ignore"):
        along = np.array([model(int(x)) for x in grid], dtype=np.float64)
    if not np.all(np.isfinite(along)):
        return False
    predicted = along[np.searchsorted(grid, t.astype(np.int64))]
    if np.any(np.diff(along) > 1e-9 * max(1.0, float(np.abs(along).max()))):
        return False
    error = float(np.sum((predicted - e) ** 2))
    return error <= max(float(np.sum((e - e.mean()) ** 2)), 1e-12 * float(np.sum(e ** 2)))


def _exponential(coefficients: tuple[float, float, float], t0: float = 0.0) -> CostModel:
    """lowtime's exponential cost model with given coefficients, in time shifted by ``t0``
    (quantized units), through its public base."""
    import numpy as np
    from lowtime.cost_model import CostModel

    class FixedExponential(CostModel):
        """``a·exp(b·(t − t0)) + c`` (J) at quantized time ``t``, coefficients fitted here."""

        def __init__(self) -> None:
            self.coefficients = coefficients
            self.t0 = t0

        def __call__(self, quant_time: int) -> float:
            a, b, c = self.coefficients
            return float(a * np.exp(b * (quant_time - self.t0)) + c)

    return FixedExponential()


def _lower_hull(t: NDArray[np.float64], e: NDArray[np.float64]) -> CostModel:
    """The lower convex hull of the options ``(t, e)`` (quantized time, J) up to its cheapest
    corner, interpolated linearly between its corners and constant beyond them: convex and never
    rising with time, as the solvers' exponential is."""
    import numpy as np
    from lowtime.cost_model import CostModel

    order = np.lexsort((e, t))
    hull: list[tuple[float, float]] = []
    for x, y in zip(t[order], e[order]):
        if hull and hull[-1][0] == x:
            continue  # the cheaper option at the same time came first
        while len(hull) >= 2 and ((hull[-1][0] - hull[-2][0]) * (y - hull[-2][1])
                                  - (hull[-1][1] - hull[-2][1]) * (x - hull[-2][0])) <= 0:
            hull.pop()
        hull.append((float(x), float(y)))
    cheapest = min(range(len(hull)), key=lambda k: hull[k][1])
    hull = hull[:cheapest + 1]  # beyond the cheapest corner the cost stays, never rises
    xs, ys = np.array([p[0] for p in hull]), np.array([p[1] for p in hull])

    class LowerHull(CostModel):
        """The options' lower convex hull (J) at quantized time ``t``, flat past its cheapest
        corner."""

        def __init__(self) -> None:
            self.corners = tuple(hull)

        def __call__(self, quant_time: int) -> float:
            return float(np.interp(quant_time, xs, ys))

    return LowerHull()
