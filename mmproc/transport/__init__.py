"""Hand-off of embeddings to the consumer: one folder per transport, and the shared lease bookkeeping."""
