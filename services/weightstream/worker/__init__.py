"""The CS-2 worker: a numpy wafer emulator that holds one unit's weights (plus the next, prefetched) and
its own activations, and runs the units of numerics/ forward and backward as weights stream in."""
