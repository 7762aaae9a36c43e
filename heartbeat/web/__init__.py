"""The status page and the Prometheus metrics."""
