"""The device check: one prepared run on one lent GPU (``benchmarks/device_check.sh``), in
phases (:mod:`benchmarks.device_check.phases`), with its probes, its contention measurement and
its fault test. A checkout's tool, outside the package: it runs the repository's GPU tests."""
