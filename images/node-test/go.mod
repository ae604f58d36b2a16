module gpusched.local/nodetest

go 1.26.0
