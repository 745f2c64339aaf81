"""The tests mirror the package: media/, preprocess/, model/ (models, layers, kernels), runner/ (batching and the
runner), transport/, wire/, client/, engines/, service/, bench/, deploy/; acceptance/ holds the end-to-end checks
(real-layout checkpoints, transformers, the hostile corpus, the soak); fuzz/ the media fuzzer. Shared helpers are in
support/ (samples, checkpoints, references, the in-process server). The root conftest only skips `cuda` tests without
a GPU; the folders whose tests talk to a server get `tiny_server` from their own conftest."""
