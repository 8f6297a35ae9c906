"""The scaling model: what a step of weight streaming costs at N workers, and where scaling breaks.

What belongs here: pure arithmetic over a cluster's measured or stated costs (``cluster``), the step a
params file asks for (``workload``), the cost model (``model``), its calibration on this machine from
measurements at N = 1 (``calibrate``, with the in-process timings of ``measure``), and the
``weightstream simulate`` command (``cli``, ``report``). What does not: running roles or jobs (the bench
``bench/scaling.py`` does that and hands the numbers in), gRPC, processes. An import-linter contract
keeps it so.
"""

from weightstream.simulate.calibrate import Measurements, NullRun, calibrate
from weightstream.simulate.cluster import PRESETS, Cluster, ClusterError, cerebras_like, load_cluster
from weightstream.simulate.model import TERMS, Prediction, predict, predict_one
from weightstream.simulate.workload import Workload, build_workload

__all__ = [
    "PRESETS",
    "TERMS",
    "Cluster",
    "ClusterError",
    "Measurements",
    "NullRun",
    "Prediction",
    "Workload",
    "build_workload",
    "calibrate",
    "cerebras_like",
    "load_cluster",
    "predict",
    "predict_one",
]
