"""SwarmX: the broadcast/reduce tree between MemoryX and the CS-2 workers. Downward it broadcasts each unit
once per subtree; upward it sums the workers' gradients in a fixed child order."""
