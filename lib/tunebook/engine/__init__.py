"""The engine room: the one owner of vLLM and of the processes that run it.

adapter (the only module that imports vllm in-process), knobs (settings checked against the
installed EngineArgs), isolation (process groups), launcher (`vllm serve` forked from a process
that imported vLLM's CLI once), interrupt (Ctrl-C), flags (settings as vLLM CLI flags and env),
vllm_http (vLLM's HTTP protocol: metric names, Prometheus and SSE parsing, free ports),
checkpoint (random-init weights for a config-only model). Imports only `tunebook.core`.
"""
