"""Shared fixtures: workloads, graphs and simulators are cheap and deterministic."""

from __future__ import annotations

import pytest

from kareus.backends.sim import SimulatorBackend
from kareus.hardware.presets import get_preset
from kareus.suite.datasets import perseus_profile
from workloads import make_workload
from workloads.graph_builder import build_iteration_graph


@pytest.fixture(scope="session")
def a100():
    return get_preset("a100-sxm4-40gb")


@pytest.fixture()
def sim(a100):
    return SimulatorBackend(a100)


@pytest.fixture(scope="session")
def llama_tp8():
    return build_iteration_graph(make_workload("llama3.2-3b"))


@pytest.fixture(scope="session")
def llama_cp2():
    return build_iteration_graph(make_workload("llama3.2-3b", tp=4, cp=2))


def artifact_or_skip(name: str):
    """Path of a file of the shared Kareus artifact, or skip (a user's clone has no shared/)."""
    from kareus.suite.datasets import kareus_artifact

    path = kareus_artifact(name)
    if path is None:
        pytest.skip(f"shared/kareus_artifact/{name} not available")
    return path


def profile_or_skip(name: str):
    """Path of a shared Perseus profile, or skip (a user's clone has no shared/ folder)."""
    path = perseus_profile(name)
    if path is None:
        pytest.skip(f"shared/perseus_sosp24/stage_profile/{name} not available")
    return path


@pytest.fixture(scope="module")
def one_thread():
    """Tiny CPU tensors: one intra-op thread (spinning OpenMP workers on a busy machine cost
    milliseconds per op)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
