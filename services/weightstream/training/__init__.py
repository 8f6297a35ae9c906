"""Training a job: what happens between "the roles are up" and "the last checkpoint is written".

- ``runner``: the appliance's job runner (one step = RunStep on the workers, GradNormSq and ApplyUpdate on
  the MemoryX shards), evaluation and checkpoints, over any ``backends`` implementation.
- ``cadence``: when a run logs, evaluates and checkpoints; one rule for the appliance and the reference.
- ``records`` and ``events``: what a run reports, typed (each step's record, the lines of ``metrics.jsonl``,
  the job's events); ``metrics_writer`` writes the records out, ``run_state`` is where a run stands.
- ``checkpoints``: finishing a checkpoint the shards have written (index, config.json, trainer state).
- ``reference``: the in-process reference trainer that the appliance must reproduce step for step.

Nothing here knows about the job queue or HTTP (``jobs``), or how a process or pod is started.
"""
