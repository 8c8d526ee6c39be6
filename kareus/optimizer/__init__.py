"""The Kareus optimizer: per-partition search (:mod:`~kareus.optimizer.search`), composition of
the per-partition fronts (:mod:`~kareus.optimizer.compose`) and the whole method
(:mod:`~kareus.optimizer.kareus`). Registered as the ``kareus`` entry point; the suite and the CLI
reach it only through :mod:`kareus.plugins`."""

from kareus.optimizer.kareus import Kareus

__all__ = ["Kareus"]
