#!/bin/sh
# A Spark resource discovery script for a worker that has two (pretend) GPUs: Spark only
# needs the addresses, and tests/engine/test_cluster_gpus.py needs no real GPU.
echo '{"name": "gpu", "addresses": ["0", "1"]}'
