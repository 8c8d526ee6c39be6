"""Kareus: joint reduction of dynamic and static energy in large-model training.

The package holds the framework (iteration graph, backends, harness, plugins) and the Kareus
optimizer; baselines live in ``baselines/`` and workloads in ``workloads/``.
"""

__version__ = "0.1.0"
