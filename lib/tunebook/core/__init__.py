"""The ground floor: what a measurement is, and its arithmetic. Pure Python, no vLLM.

errors, model (config.json shapes and KV arithmetic), points (Point and Result), workloads,
metrics (percentiles, the one SLO and the one noise rule), results (run folders), claims (the
ledger's records), scenarios (the served scenarios and their SLOs). Imports nothing above it.
"""
