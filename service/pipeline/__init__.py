"""The request pipeline behind the front ends: admission and overload, the embedding cache, the decode pool and
its workers, the forward on the runner, delivery through a transport, kept keys, video."""
