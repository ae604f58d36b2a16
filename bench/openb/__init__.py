"""Replay of the openb GPU trace under FGD's published protocol (issue 20, item 3), no Kubernetes.

``trace`` loads the CSVs, ``replay`` samples a workload and places it pod by pod on the trace's
nodes, ``policies`` holds the node scorers (Random, BestFit, FGD). ``bench.openb_replay`` is the CLI.
"""
