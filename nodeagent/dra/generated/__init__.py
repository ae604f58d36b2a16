"""Generated kubelet plugin registration v1 (``registration``) and DRA plugin v1 (``drav1``) messages
and stubs, from nodeagent/dra/proto (see hack/gen-proto.sh)."""
