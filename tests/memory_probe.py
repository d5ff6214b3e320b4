"""A dispatch mode that records the largest tensor any operator produces: how the tests check that
a fast path never materialises the ``(heads, N, N)`` or ``(B, heads, N, N)`` tensors of the dense
one."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class LargestOutput(TorchDispatchMode):
    """Records the number of elements of the largest tensor any operator produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out
