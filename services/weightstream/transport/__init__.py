"""Moving tensors and calls between roles over gRPC."""
