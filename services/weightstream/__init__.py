"""weightstream: a weight-streaming training appliance.

The roles, one package each: ``memoryx`` (weights and optimizer state), ``swarmx`` (broadcast and
reduce), ``worker`` (the CS-2 emulator), ``activation`` (batches). Shared pieces: ``numerics`` (the math),
``params``, ``data``, ``transport`` (gRPC and tensor streams), ``proto`` (generated), ``plan`` (a job's
layout), ``checkpoint_layout``, ``role`` (serving a role), ``blas_kernel`` (numpy's OpenBLAS kernels,
chosen before numpy loads). The coordinator: ``training`` (driving a job), ``backends`` (where roles run),
``jobs`` (the service). ``cli`` and ``console`` are the command line.
"""

from weightstream.blas_kernel import choose_openblas_kernel

# Before anything imports numpy: its OpenBLAS reads the kernel choice once, when it loads (blas_kernel.py).
choose_openblas_kernel()

__version__ = "0.1.0"
