"""The mmproc service: gRPC (grpc.aio) and HTTP front ends, settings, CLI. The only package, with
`mmproc/client.py`, that touches gRPC or protobuf."""
