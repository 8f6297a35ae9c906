"""Training data: the processors an activation server reads, sharded deterministically per step."""

from weightstream.data.processors import DataError, DataProcessor, make_data_processor

__all__ = ["DataError", "DataProcessor", "make_data_processor"]
