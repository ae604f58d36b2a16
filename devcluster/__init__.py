"""A local, real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler) with gpusched on it.

Used by the end-to-end tests and by the demo (``make demo``): the same harness, so what the demo
shows is what the tests check. Not part of the installed distribution."""
