"""Throughput benchmarks."""
