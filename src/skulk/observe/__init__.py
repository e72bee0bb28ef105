"""Seeing inside a running node and cluster: Prometheus metrics, the flight recorder, cluster
diagnostics gathering, task-scoped traces, capture bundles and structured logs.

Nothing here decides how the cluster behaves: these modules observe and report.
"""
