"""Activation servers: read the training data (data/) and hand each worker its shard of every global batch."""
