"""Tools that Kareus and the baselines share: lowtime's time-cost trade-off
(:mod:`~kareus.methods.tradeoff`), per-instruction profiling (:mod:`~kareus.methods.profiling`)
and the exact MILP (:mod:`~kareus.methods.exact`). Methods sit above the data model, the hardware
and the backends, and below the suite: nothing here imports :mod:`kareus.suite`."""
