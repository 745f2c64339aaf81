"""The mmproc service: front ends (frontends/), the request pipeline (pipeline/), the embedding cache (cache/)
and the process (process/: CLI, settings, app). With mmproc/wire and mmproc/client, the only code that touches
gRPC or protobuf."""
