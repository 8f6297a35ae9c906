"""weightstream: a weight-streaming training appliance."""

__version__ = "0.1.0"
