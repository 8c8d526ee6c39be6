"""Tools that Kareus and the baselines share: lowtime's time-cost trade-off
(:mod:`~kareus.methods.tradeoff`, with its cost model, time unit and slack reclaimer beside it),
per-instruction profiling (:mod:`~kareus.methods.profiling`)
and the exact MILP (:mod:`~kareus.methods.exact`). Methods sit above the data model, the hardware
and the backends, and below the suite: nothing here imports :mod:`kareus.suite`."""
