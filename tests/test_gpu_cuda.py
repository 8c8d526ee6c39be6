"""Tests that need a CUDA GPU (``python -m pytest -m gpu``); they skip without one. They never
change clocks or power limits unless ``KAREUS_ALLOW_CLOCK_CONTROL=1``. Written for one GPU (an
H200 in this workplace); each takes seconds."""

from __future__ import annotations

import datetime
import os

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CLOCKS_ALLOWED = os.environ.get("KAREUS_ALLOW_CLOCK_CONTROL") == "1"


def _small_spec(layers: int = 2):
    from workloads.models import ModelSpec

    # Qwen 3 shaped, narrower: GQA, QK-norm, RoPE, SwiGLU
    return ModelSpec("cuda-small", hidden=1024, heads=8, kv_heads=4, head_dim=128, ffn=2816,
                     layers=layers, vocab=32000, native_seq=1024, mlp="swiglu",
                     norm="rmsnorm", qk_norm=True, tied_embeddings=True)


def test_transformer_layer_bf16_forward_backward():
    from workloads.torch_model import TransformerLayer

    torch.manual_seed(0)
    layer = TransformerLayer(_small_spec(), dtype=torch.bfloat16, device="cuda")
    x = torch.randn(2, 1024, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    y.float().pow(2).mean().backward()
    torch.cuda.synchronize()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.fixture()
def one_rank_nccl(tmp_path):
    """A one-rank NCCL world: real NCCL kernels (on the side stream) without a second GPU."""
    import torch.distributed as dist

    from kareus.backends.gpu.runner import nccl_options

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1, device_id=torch.device("cuda", 0),
                            timeout=datetime.timedelta(seconds=120))
    try:
        limited = dist.new_group([0], pg_options=nccl_options(8))
        yield dist.group.WORLD, limited
    finally:
        dist.destroy_process_group()


def test_nanobatched_side_stream_equals_sequential(one_rank_nccl):
    """Collectives cut the layers (one-rank NCCL all-reduces on the side stream, CTA-limited
    communicator, varied launch slots); results equal the sequential run and the reference."""
    import copy

    import torch.nn.functional as F

    from kareus.backends.gpu.engine import GroupComm, Schedule, StageEngine
    from workloads.torch_model import GPTStage

    world, limited = one_rank_nccl
    assert limited is not None
    torch.manual_seed(0)
    spec = _small_spec()
    ref = GPTStage(spec, 2, first=True, last=True, dtype=torch.float32, device="cuda")
    tok = torch.randint(0, spec.vocab, (4, 512), device="cuda")
    tgt = torch.randint(0, spec.vocab, (4, 512), device="cuda")
    loss = F.cross_entropy(ref(tok).float().flatten(0, 1), tgt.flatten())
    loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
    comm = GroupComm({None: world, 8: limited}, 1)
    results = []
    for nano in (False, True):
        m = copy.deepcopy(ref)
        m.zero_grad(set_to_none=True)
        eng = StageEngine(m, comm)
        keys = {d: [f"{d}{i}" for i in range(len(eng.op_names(d, True)))]
                for d in ("forward", "backward")}
        eng.partition_keys = keys
        # odd partitions: the 8-CTA communicator; even: NCCL's default; slots 0..2
        parts = tuple((k, (8 if i % 2 else None, i % 3, None if i % 2 else i % 3)) for d in keys
                      for i, k in enumerate(keys[d])) if nano else ()
        sched = Schedule(nano, parts)
        st = eng.forward(tok, sched, tgt)
        eng.backward(st, sched)
        torch.cuda.synchronize()
        results.append((st.loss.detach(), {n: p.grad for n, p in m.named_parameters()}))
    for got_loss, grads in results:
        torch.testing.assert_close(got_loss, loss.detach(), rtol=1e-4, atol=1e-5)
        for n, g in ref_grads.items():
            torch.testing.assert_close(grads[n], g, rtol=2e-3, atol=2e-5, msg=n)


def test_side_stream_collectives_are_joined_before_use():
    """A slow collective that changes its tensor (an all-reduce over two identical ranks: x2,
    after ~1 ms of GPU sleep on the stream it is issued on): the nanobatched schedule, whose
    collectives run on the side stream, must equal the sequential one -- it would read
    unreduced values if the main stream did not wait for the side stream."""
    import copy

    from kareus.backends.gpu.engine import LocalComm, Schedule, StageEngine
    from workloads.torch_model import GPTStage

    class SlowTwoRanks(LocalComm):
        def all_reduce(self, t, sms=None, op="sum"):
            torch.cuda._sleep(2_000_000)  # GPU cycles on the current (side) stream
            return super().all_reduce(t, sms, op)

    torch.manual_seed(0)
    spec = _small_spec()
    base = GPTStage(spec, 2, first=True, last=True, dtype=torch.float32, device="cuda")
    tok = torch.randint(0, spec.vocab, (4, 512), device="cuda")
    tgt = torch.randint(0, spec.vocab, (4, 512), device="cuda")
    results = []
    for nano in (False, True):
        m = copy.deepcopy(base)
        eng = StageEngine(m, SlowTwoRanks(2))
        keys = {d: [f"{d}{i}" for i in range(len(eng.op_names(d, True)))]
                for d in ("forward", "backward")}
        eng.partition_keys = keys
        parts = tuple((k, (None, i % 3, None)) for d in keys for i, k in enumerate(keys[d])) \
            if nano else ()
        sched = Schedule(nano, parts)
        st = eng.forward(tok, sched, tgt)
        eng.backward(st, sched)
        torch.cuda.synchronize()
        results.append((st.loss.detach(), {n: p.grad for n, p in m.named_parameters()}))
    (loss_seq, g_seq), (loss_nano, g_nano) = results
    torch.testing.assert_close(loss_nano, loss_seq, rtol=1e-4, atol=1e-5)
    for n, g in g_seq.items():
        torch.testing.assert_close(g_nano[n], g, rtol=2e-3, atol=2e-5, msg=n)


def test_zeus_window_positive_energy_and_time():
    pytest.importorskip("zeus")
    from kareus.backends.gpu.measure import MeasureConfig, ZeusMeter, measure_window

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

    def step():
        for _ in range(20):
            a @ a

    res = measure_window(step, ZeusMeter([0]), MeasureConfig(warmup_s=0.5, window_s=1.5),
                         sync=torch.cuda.synchronize)
    assert res.time_s >= 1.0 and res.energy_j > 0
    assert 30.0 < res.energy_j / res.time_s < 1500.0  # watts of one busy GPU


def test_nvml_counter_window_positive_energy_and_time():
    """The window the backend uses without zeus: NVML's energy counter read directly."""
    from kareus.backends.gpu.device import NvmlDevice
    from kareus.backends.gpu.measure import CounterMeter, MeasureConfig, measure_window

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

    def step():
        for _ in range(20):
            a @ a

    meter = CounterMeter([NvmlDevice(0)], sync=torch.cuda.synchronize)
    res = measure_window(step, meter, MeasureConfig(warmup_s=0.5, window_s=1.5),
                         sync=torch.cuda.synchronize)
    assert res.time_s >= 1.0 and 30.0 < res.energy_j / res.time_s < 1500.0


def _matching_backend(**kw):
    from kareus.backends.gpu import GPUBackend
    from kareus.backends.gpu.environment import match_preset, probe_environment
    from kareus.backends.gpu.measure import MeasureConfig
    from kareus.hardware.presets import get_preset

    env = probe_environment()
    name = match_preset(env.gpu_names[0], env.gpu_memory[0]) if env.gpu_names else None
    if not env.gpu_names:
        pytest.fail(f"NVML lists no GPU: {env.zeus_error or env.nvml_error}")
    if name is None:
        pytest.skip(f"no preset describes {env.gpu_names[:1]}")
    measure = MeasureConfig(warmup_s=1.0, warmup_steps=2, window_s=2.0, min_steps=2)
    return GPUBackend.create(get_preset(name), env=env, measure=measure, announce=False, **kw)


def test_backend_measures_a_plan_on_one_gpu():
    from kareus.backends.gpu.serialize import reduced_workload
    from kareus.plan import IterationPlan

    b = _matching_backend()
    w = reduced_workload("qwen3-1.7b", 2, tp=1, pp=1, mbs=2, seq=1024, microbatches=2)
    g = b.bind(w)
    for nano in (False, True):
        res = b.evaluate_plan(g, IterationPlan.uniform(g, b.gpu.clock_max_mhz, nano))
        rank = b.last_run[0].to_dict()
        assert res.time_s > 0 and res.energy.total_j > 0
        assert 30.0 < res.energy.total_j / res.time_s < 1500.0
        assert res.energy.total_j == pytest.approx(rank["energy_j"] / rank["steps"])
        assert rank["sm_clock_mhz"] and rank["sm_clock_mhz"] > 100
        assert len(rank["losses"]) == 2 and all(10.0 < x < 13.0 for x in rank["losses"])
        assert not rank["clocks_locked"]


def test_backend_instruction_and_partition_on_one_gpu():
    import numpy as np

    from kareus.backends.gpu.serialize import reduced_workload
    from kareus.plan import InstructionPlan

    b = _matching_backend()
    w = reduced_workload("qwen3-1.7b", 2, tp=1, pp=1, mbs=2, seq=1024, microbatches=2)
    g = b.bind(w)
    cost = b.evaluate_instruction(g, (0, "backward"), InstructionPlan.make(b.gpu.clock_max_mhz))
    assert cost.time_s > 0 and np.isfinite(cost.dynamic_energy_j)
    part = g.instruction_graphs[(0, "forward")].partitions[0]
    grid = b.evaluate_partition(part, np.array([b.gpu.clock_max_mhz]), np.array([8]),
                                np.array([[0, 0]]))  # one (start, end) window
    assert grid.time_s.shape == (1, 1, 1) and grid.time_s[0, 0, 0] > 0


@pytest.mark.skipif(not CLOCKS_ALLOWED, reason="set KAREUS_ALLOW_CLOCK_CONTROL=1 to test "
                                               "locking clocks")
def test_clock_lock_and_restore_on_the_gpu():
    from kareus.backends.gpu.clocks import ClockController
    from kareus.backends.gpu.device import open_device

    dev = open_device(0)
    clocks = dev.supported_sm_clocks_mhz()
    target = clocks[len(clocks) // 3]
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    with ClockController([dev], allow=True) as c:
        assert c.lock(target) == target
        for _ in range(50):
            a @ a
        seen = dev.sm_clock_mhz()
        torch.cuda.synchronize()
    assert seen <= target + 1
    for _ in range(50):
        a @ a
    assert dev.sm_clock_mhz() >= seen  # unlocked again
