"""One router per resource: ``jobs`` (submit, list, get, cancel, metrics, logs), ``events`` (the live
stream of a job), ``checkpoints`` (list and download), ``service`` (health and Prometheus, no auth)."""
