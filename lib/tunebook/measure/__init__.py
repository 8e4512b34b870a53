"""Measurement: points run on real engines, in-process, isolated or served.

execute (one point, start to finish), served (served mode: `vllm serve` replicas behind
vllm-router, the capacity search), loadgen (the streamed HTTP client), sweep (points in order,
written one by one, resumable), ray_executor (points as Ray tasks), live (a view while a sweep
runs). Imports `tunebook.core` and `tunebook.engine`.
"""
