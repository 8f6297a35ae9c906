"""Moving tensors and calls between roles over gRPC: tensor streams (``tensors``), servers, channels and
error mapping (``rpc``), and the role plane's per-job credential (``auth``)."""
