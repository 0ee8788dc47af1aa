"""attnclust benchmarks: ``python -m bench [--quick]`` from the repository root (see bench/README.md)."""
