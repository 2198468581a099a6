#!/bin/sh
# A stand-in for nvidia-smi on a machine without GPUs (tests/engine/test_local_gpus.py copies it onto
# PATH as `nvidia-smi`). It answers the engine's query, `--query-gpu=index --format=csv,noheader`, with
# one index per line for $FAKE_GPUS GPUs; $FAKE_SMI_EXIT makes it fail as a broken driver does, and
# $FAKE_SMI_SLEEP makes it hang first.
[ "$1" = "--query-gpu=index" ] && [ "$2" = "--format=csv,noheader" ] || { echo "unexpected arguments: $*" >&2; exit 2; }
[ -n "$FAKE_SMI_SLEEP" ] && sleep "$FAKE_SMI_SLEEP"
if [ -n "$FAKE_SMI_EXIT" ]; then
    echo "No devices were found"
    exit "$FAKE_SMI_EXIT"
fi
i=0
while [ "$i" -lt "${FAKE_GPUS:-0}" ]; do
    echo "$i"
    i=$((i + 1))
done
