"""The request pipeline behind the front ends: admission and overload, the decode pool and its workers, the
engine that feeds the runner, the IPC pool set-up, kept keys, video."""
