"""Baseline optimizers, each a plugin registered under the ``kareus.optimizers`` entry points:
Megatron-LM, Perseus, nanobatching, nanobatching + Perseus, EnvPipe and the Zeus power limit."""
