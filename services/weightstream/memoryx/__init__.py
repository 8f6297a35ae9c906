"""MemoryX: the weight servers. Each shard holds the fp32 master weights and optimizer state of the units
assigned to it, streams units out on request and applies the optimizer (numerics/optim.py) to summed
gradients."""
