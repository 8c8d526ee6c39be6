"""The comparison suite: building a problem (:mod:`~kareus.suite.problem`, from the faces'
shared options, :mod:`~kareus.suite.options`), running optimizers on it
(:mod:`~kareus.suite.harness`, :mod:`~kareus.suite.executors`, :mod:`~kareus.suite.sweep`),
storing cells and knowing what made them (:mod:`~kareus.suite.store`,
:mod:`~kareus.suite.provenance`, :mod:`~kareus.suite.records`), the suites themselves
(:mod:`~kareus.suite.suites`) and their tables and figures (:mod:`~kareus.suite.report`,
:mod:`~kareus.suite.tables`, :mod:`~kareus.suite.style`, :mod:`~kareus.suite.progress`,
:mod:`~kareus.suite.export`); the simulator held against measurements
(:mod:`~kareus.suite.datasets`, :mod:`~kareus.suite.fidelity`,
:mod:`~kareus.suite.megatron_runs`, :mod:`~kareus.suite.megatron_scaling`) and the docs'
generated blocks (:mod:`~kareus.suite.docs_render`). The suite may import every layer below it,
never the faces (:mod:`kareus.cli`, ``reproduce.py``)."""
