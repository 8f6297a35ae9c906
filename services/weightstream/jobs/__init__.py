"""The appliance as a service: a persistent queue of jobs, run on a fixed number of CS-2 slots.

- ``store``: every accepted job and its events, in SQLite.
- ``service``: the behaviour (validate and enqueue, schedule by priority over free slots, cancel, recover
  after a restart, answer what a job did); no HTTP or gRPC in it.
- ``api/``: the REST API (FastAPI), a router per resource; ``grpc_api``: the same service over gRPC.
- ``metrics``: the Prometheus collector.

Jobs run through ``training`` on a ``backends`` implementation; nothing here reaches into a role.
"""
