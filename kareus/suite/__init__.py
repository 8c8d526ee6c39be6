"""The comparison suite: building a problem (:mod:`~kareus.suite.problem`), running optimizers
on it (:mod:`~kareus.suite.harness`, :mod:`~kareus.suite.executors`), storing cells
(:mod:`~kareus.suite.store`, :mod:`~kareus.suite.records`), the suites themselves
(:mod:`~kareus.suite.suites`) and their tables and figures (:mod:`~kareus.suite.report`,
:mod:`~kareus.suite.export`). The suite may import every layer below it, never the faces
(:mod:`kareus.cli`, ``reproduce.py``)."""
