"""The NIXL transport: embeddings across nodes. The encoder's pool is registered once with a NIXL agent; a reply
names a lease, the consumer asks over its session to have it read into its own registered buffer, and the producer
writes it there after checking the lease (docs/nixl.md)."""
