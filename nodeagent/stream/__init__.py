"""The node agent's side of the telemetry stream to the extender."""
