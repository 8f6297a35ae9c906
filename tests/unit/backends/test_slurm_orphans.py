"""The steps of replaced roles that Slurm still lists (backends/slurm/orphans.py), against a fake Slurm: each
is cancelled again until Slurm lists it no more, or left to Slurm once its node has left the job."""

from __future__ import annotations

import threading

from weightstream.backends.base import BackendError
from weightstream.backends.slurm.orphans import OrphanSteps


class FakeSlurm:
    """The job's listed steps and nodes; ``cancel`` records each call and ends the steps of nodes that
    answer (``answering``)."""

    def __init__(self, steps: dict[str, str], nodes: set[str]) -> None:
        self.steps, self.nodes, self.answering = dict(steps), set(nodes), set(nodes)
        self.cancels: list[list[str]] = []
        self.swept = threading.Event()

    def listed(self) -> list[str]:
        return list(self.steps)

    def job_nodes(self) -> list[str]:
        return sorted(self.nodes)

    def cancel(self, ids: list[str]) -> None:
        self.cancels.append(ids)
        for step in ids:
            if self.steps[step] in self.answering:
                del self.steps[step]
        self.swept.set()


def test_a_step_is_cancelled_again_until_its_node_answers() -> None:
    slurm = FakeSlurm({"7.3": "h2", "7.9": "h5"}, {"h1", "h2", "h5"})
    slurm.answering = {"h1", "h5"}  # h2 is cut off
    orphans = OrphanSteps(slurm.listed, slurm.job_nodes, slurm.cancel, interval_s=3600)
    orphans.add("7.3", "h2")
    assert orphans.sweep() == ["7.3"] and orphans.left == {"7.3": "h2"}  # still listed
    slurm.answering.add("h2")  # the link is back
    assert orphans.sweep() == ["7.3"]  # ended now; forgotten once Slurm lists it no more
    assert orphans.sweep() == [] and orphans.left == {}
    assert slurm.cancels == [["7.3"], ["7.3"]] and "7.9" in slurm.steps  # the replacement's step stays
    orphans.close()


def test_a_step_whose_node_left_the_job_is_slurms_to_end() -> None:
    slurm = FakeSlurm({"7.3": "h2", "7.4": "h3"}, {"h1", "h3"})  # h2 marked down: out of the job
    orphans = OrphanSteps(slurm.listed, slurm.job_nodes, slurm.cancel, interval_s=3600)
    orphans.add("7.3", "h2")
    orphans.add("7.4", "h3")
    slurm.answering = set()
    assert orphans.sweep() == ["7.4"]
    assert orphans.left == {"7.4": "h3"}
    orphans.close()
    assert orphans.left == {}


def test_the_thread_sweeps_until_none_is_left_and_outlives_slurms_errors() -> None:
    slurm = FakeSlurm({"7.3": "h2"}, {"h2"})
    failures = iter([BackendError("squeue: slurmctld busy")])

    def listed() -> list[str]:
        error = next(failures, None)
        if error is not None:
            raise error
        return slurm.listed()

    orphans = OrphanSteps(listed, slurm.job_nodes, slurm.cancel, interval_s=0.01)
    orphans.add("7.3", "h2")
    assert slurm.swept.wait(10)  # the second round, after the failed one, cancels it
    orphans.close()
    assert slurm.steps == {} and slurm.cancels == [["7.3"]]
