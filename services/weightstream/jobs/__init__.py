"""The appliance as a service: a persistent queue of jobs, run on a fixed number of CS-2 slots.

- ``store``: every accepted job and its events, in SQLite; ``notify``: the feed that wakes followers when
  the store changes (no polling, no thread per stream).
- ``service``: the behaviour (validate and enqueue, schedule by priority over free slots, cancel, relabel
  and reprioritise, recover after a restart, requeue on shutdown, answer what a job did); no HTTP or gRPC
  in it. ``config``: what `serve` was told (``ServiceConfig``, the user name jobs are recorded with).
- ``log_export``: a job's logs as one bounded tar.gz, streamed, read only from its own directory.
- ``admission``: the checks a job passes before anything of it runs, in one order, each once: the one
  pipeline of ``weightstream validate``, ``weightstream run`` and the service (REST and gRPC alike).
  ``limits`` and ``data_roots``: what a job submitted to the service may ask for and read.
- ``api/``: the REST API (FastAPI), a router per resource; ``grpc_api``: the same service over grpc.aio.
- ``metrics``: the Prometheus collector.

Jobs run through ``training`` on a ``backends`` implementation; nothing here reaches into a role.
"""
