"""The protobuf wire codec that the server and the client share (the server never imports mmproc.client): dtypes,
the replies' hand-written framing, each transport's reply codec, and the transports' table (transports.py).
Requests, errors and reassembly of replies stay with the client (mmproc/client/rpc.py)."""
