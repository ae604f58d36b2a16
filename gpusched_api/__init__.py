"""Wire contracts shared by gpusched components (generated code lives beside its .proto)."""
