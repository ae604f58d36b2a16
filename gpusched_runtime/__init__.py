"""What several gpusched programs run the same way: the list+watch reflector, the one retry
backoff, and typed settings that generate a program's command line.

The extender, the node agent and the engine sidecar import it; it imports none of them (nor the
CLI or the dev cluster), so a program that uses it stands beside the others, not above one
(import-linter contract in pyproject.toml). No module here keeps mutable state at module level.
"""
