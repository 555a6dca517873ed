"""What the scheduler reports about itself to OpenTelemetry, with the optional ``[otel]`` extra:
metrics (``metrics``) and one trace from an enqueue to its runs (``tracing``). Without the
extra each call is a no-op.
"""
