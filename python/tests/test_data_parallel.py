"""Data parallel: a MeanFlow step with jvpc inside DistributedDataParallel, and inside FSDP2
(fully_shard), gives the gradients of one process on the whole batch. Two processes, gloo, CPU.

The module DDP or fully_shard wraps is the training step (jvpc's program called in its forward);
the program traces the inner network, whose weights it reads by name at each call: under FSDP2
those are the unsharded parameters the root's pre-forward hook has put in place."""


import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import jvpc

from dit import DiT

WORLD = 2


class MeanFlowStep(nn.Module):
    """loss(z, r, t, v) of MeanFlow, jvpc's program compiled at the first call."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net
        self.prog = None

    def forward(self, z, r, t, v):
        if self.prog is None:
            self.prog = jvpc.compile(self.net, z, r, t)
        u, jvp_fn = self.prog(z, r, t)
        dudt = jvp_fn(v, torch.zeros_like(r), torch.ones_like(t))
        u_tgt = v - (t - r)[:, None, None] * dudt
        return ((u - u_tgt.detach()) ** 2).mean()


def batch():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(4, 8, 4, generator=g, dtype=torch.float64)
    t = torch.rand(4, generator=g, dtype=torch.float64)
    return z, t * 0.5, t, torch.randn(4, 8, 4, generator=g, dtype=torch.float64)


def reference_grads():
    torch.manual_seed(0)
    step = MeanFlowStep(DiT().double())
    step(*batch()).backward()
    return {n: p.grad for n, p in step.named_parameters()}


def worker(rank, kind, init_file, out_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(0)
        step = MeanFlowStep(DiT().double())
        half = [x.chunk(WORLD)[rank] for x in batch()]
        if kind == "ddp":
            wrapped = nn.parallel.DistributedDataParallel(step)
            wrapped(*half).backward()
            grads = {n: p.grad for n, p in step.named_parameters()}
        else:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            fully_shard(step, mesh=init_device_mesh("cpu", (WORLD,)), reshard_after_forward=False)
            step(*half).backward()
            grads = {n: p.grad.full_tensor() for n, p in step.named_parameters()}
        if rank == 0:
            torch.save(grads, out_file)
        dist.barrier()  # both ranks done before either tears the process group down
    finally:
        dist.destroy_process_group()


def run(kind, tmp_path):
    out = tmp_path / "grads.pt"
    mp.spawn(worker, args=(kind, str(tmp_path / "init"), str(out)), nprocs=WORLD, join=True)
    got, ref = torch.load(out), reference_grads()
    assert got.keys() == ref.keys()
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], rtol=1e-10, atol=1e-12, msg=n)


def test_ddp_gives_the_whole_batchs_gradients(tmp_path):
    run("ddp", tmp_path)


def test_fsdp2_gives_the_whole_batchs_gradients(tmp_path):
    run("fsdp", tmp_path)


def test_a_function_that_calls_a_ddp_wrapped_module_traces(tmp_path):
    # DistributedDataParallel's forward opens a profiler region (record_function), whose markers
    # the trace passes over, and broadcasts the buffers, which jvpc does before tracing; the JVP is
    # the wrapped network's. A program cannot replay DDP's forward: compile refuses it.
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        net = DiT().double()
        ddp = nn.parallel.DistributedDataParallel(net)
        z, r, t, v = batch()
        tangents = (v, torch.zeros_like(r), torch.ones_like(t))
        out, dout = jvpc.jvp(lambda *a: ddp(*a), (z, r, t), tangents)
        with sdpa_kernel(SDPBackend.MATH):  # torch.func has no forward AD of the fused kernels
            want_out, want_dout = torch.func.jvp(net, (z, r, t), tangents)
        torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(dout, want_dout, rtol=1e-10, atol=1e-12)
        with pytest.raises(jvpc.Error, match="calls DistributedDataParallel's forward"):
            jvpc.compile(lambda *a: ddp(*a), z, r, t)
    finally:
        dist.destroy_process_group()
