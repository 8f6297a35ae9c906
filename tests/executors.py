"""A real one-thread executor for tests of ``optimizer_step``'s ``helper``: it notes what it is handed."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np


class CountingHelper(ThreadPoolExecutor):
    """One worker thread, noting the length of the weight slice of every update half it is handed (a
    MemoryX shard's norm thread also runs other work, which it does not note)."""

    def __init__(self) -> None:
        super().__init__(1)
        self.sizes: list[int] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        if len(args) > 3 and all(isinstance(a, np.ndarray) for a in args[:4]):  # weight, grad, m, v
            self.sizes.append(len(args[0]))
        return super().submit(fn, *args, **kwargs)
