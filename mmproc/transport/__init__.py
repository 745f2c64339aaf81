"""Hand-off of embeddings to the consumer, one folder per transport (serialized/, cuda_ipc/) and the lease
bookkeeping that every transport handing out memory shares (leases/). The table that names them: mmproc/wire."""
