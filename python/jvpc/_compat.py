"""What differs between torch releases, in one place: the private torch internals jvpc relies on,
each behind one function, and the check that the torch imported is the one jvpc was built against.

Everything else in the package uses torch's public API. A torch release that moves one of these
changes this file alone.
"""

from __future__ import annotations

import torch


def check_torch(built: str) -> None:
    """Raises ImportError, one line naming both, where the torch imported is not the release jvpc
    was built against ("2.15.0"; a local part such as "+cu132" is not compared): the extension
    links that release's LibTorch."""
    running = torch.__version__
    if built.split("+")[0] != running.split("+")[0]:
        raise ImportError(f"jvpc was built against torch {built} but torch {running} is installed: "
                          "rebuild jvpc with this torch")


def in_functorch_transform() -> bool:
    """True inside a torch.func transform (vmap, grad, jvp) of the calling thread."""
    return torch._C._functorch.peek_interpreter_stack() is not None


def in_vmap_only() -> bool:
    """True where the innermost torch.func transform of the calling thread is vmap."""
    level = torch._C._functorch.peek_interpreter_stack()
    return level is not None and level.key() == torch._C._functorch.TransformType.Vmap


def functorch_level_lowered():
    """Inside a torch.library op's vmap rule: a context in which the vmap level that runs the rule
    is off, so that code there sees that level's tensors as plain ones (an outer level stays)."""
    from torch._functorch.pyfunctorch import retrieve_current_functorch_interpreter
    return retrieve_current_functorch_interpreter().lower()


def is_functorch_wrapped(t: torch.Tensor) -> bool:
    """True for a tensor a torch.func transform wraps (a BatchedTensor of vmap, for one)."""
    return torch._C._functorch.is_functorch_wrapped_tensor(t)


def reparametrize_module(module, tensors: dict):
    """A context in which `module`'s parameters and buffers named in `tensors` are those tensors
    (what torch.func.functional_call binds; tied weights follow)."""
    from torch.nn.utils import stateless
    return stateless._reparametrize_module(module, tensors, tie_weights=True, strict=False)


def distributed_data_parallel(modules) -> list:
    """The torch.nn.parallel.DistributedDataParallel instances among `modules`."""
    from torch.nn.parallel import DistributedDataParallel
    return [m for m in modules if isinstance(m, DistributedDataParallel)]


def sync_ddp_buffers_untraced(ddp) -> None:
    """What DistributedDataParallel's forward does first (broadcasting its module's buffers from
    rank 0, where it is set to), done now, outside a trace, and skipped in the forward that
    follows: its collective writes the buffers through kernels a trace would record as writes
    into captured tensors. The forward sets the flag again when it ends."""
    if ddp._check_sync_bufs_pre_fwd():
        ddp._sync_buffers()
    ddp.require_forward_param_sync = False
