"""Per-partition multi-objective search strategies behind one interface
(:class:`~kareus.optimizer.search.base.PartitionSearch`): ``exhaustive``, ``nsga2`` (pymoo) and
``surrogate`` (tree-ensemble surrogate with hypervolume-improvement acquisition)."""

from __future__ import annotations

from typing import Literal, get_args

from kareus.errors import InputError
from kareus.optimizer.search.base import Evaluator, PartitionSearch, PartitionSpace, SearchResult

#: The strategies' names (Kareus's ``search`` setting).
Strategy = Literal["exhaustive", "nsga2", "surrogate"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)


def make_search(name: str) -> PartitionSearch:
    """The strategy called ``name``; heavy dependencies are imported only when chosen."""
    if name == "exhaustive":
        from kareus.optimizer.search.exhaustive import ExhaustiveSearch

        return ExhaustiveSearch()
    if name == "nsga2":
        from kareus.optimizer.search.nsga2 import NSGA2Search

        return NSGA2Search()
    if name == "surrogate":
        from kareus.optimizer.search.surrogate import SurrogateSearch

        return SurrogateSearch()
    raise InputError(f"unknown search strategy {name!r}; choose one of: {', '.join(STRATEGIES)}")


def min_budget(name: str) -> int:
    """The fewest configurations strategy ``name`` may be given as its budget (its
    ``min_budget`` attribute; 1 for ``exhaustive``, which measures everything and ignores the
    budget).
    Kareus's settings check a ``budget`` against it before any work."""
    return int(getattr(make_search(name), "min_budget", 1))


__all__ = ["Evaluator", "PartitionSearch", "PartitionSpace", "SearchResult", "STRATEGIES",
           "Strategy", "make_search", "min_budget"]
