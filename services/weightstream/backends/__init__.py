"""Where a job's roles run: one ``Backend`` protocol (``base``), and its implementations.

- ``local``: every role a child process of the coordinator, over loopback.
- ``kubernetes``: every role a pod (``kubernetes.manifests`` builds them as pure data;
  ``kubernetes.backend``, the only module that imports the ``kubernetes`` client, creates them).
- ``slurm``: every role a step of one Slurm job, on the node ``slurm.placement`` chose (``slurm.commands``
  runs Slurm's commands; ``slurm.backend`` drives them).

``environment`` holds what every backend gives a role's process (threads, allocator settings), once.
Nothing here knows about training steps or the job queue.
"""
