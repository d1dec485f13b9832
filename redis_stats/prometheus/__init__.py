"""What Prometheus sees: the collector, the stateless text exposition, the exporter
(``/metrics``, ``/snapshot`` and its page)."""
