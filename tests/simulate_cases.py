"""Cases for the scaling model's tests (simulate/): a small GPT-2 params file, and workloads and clusters
simple enough to work their timelines out by hand (``workload``: equal units; ``cluster``: 1 GB/s
everywhere, no latency)."""

from __future__ import annotations

from typing import Any

from weightstream.simulate.cluster import Cluster
from weightstream.simulate.workload import Tree, UnitCost, Workload

GB = 1e9

SMALL_GPT2: dict[str, Any] = {
    "train_input": {"data_processor": "SyntheticDataProcessor", "batch_size": 8, "max_sequence_length": 16},
    "model": {
        "name": "gpt2",
        "vocab_size": 64,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_heads": 2,
        "max_position_embeddings": 16,
    },
    "optimizer": {"optimizer_type": "adamw", "learning_rate": 1e-3},
    "runconfig": {"max_steps": 1, "model_dir": "unused"},
}


def workload(count: int = 3, nbytes: float = 1 * GB, flops: float = 1e12, **kw: Any) -> Workload:
    """``count`` equal units of ``nbytes`` on the wire and ``flops`` forward per sample."""
    fields: dict[str, Any] = {
        "model": "test",
        "units": tuple(UnitCost(f"u{i}", int(nbytes), int(nbytes), flops, 2 * flops) for i in range(count)),
        "num_params": 1000,
        "shard_params": (1000,),
        "tokens_per_sample": 10,
        "per_worker_batch": 1,
        "global_batch": None,
        "pipelined": False,
        "trees": {1: Tree((1,), 1), 2: Tree((2,), 1), 4: Tree((4,), 1), 16: Tree((4, 4), 5)},
        "signature": "test",
    }
    return Workload(**{**fields, **kw})


def cluster(**kw: Any) -> Cluster:
    """One worker per host, 1 GB/s everywhere, no latency, no update or barrier cost to speak of."""
    fields: dict[str, Any] = {
        "name": "test",
        "worker_flops": 1e12,
        "link_bandwidth": GB,
        "link_latency_s": 0.0,
        "swarmx_bandwidth": GB,
        "swarmx_reduce_rate": GB,
        "memoryx_bandwidth": GB,
        "memoryx_update_rate": 1e12,
        "relay": "store_and_forward",  # the timelines by hand below assume whole units per hop
    }
    return Cluster(**{**fields, **kw})
