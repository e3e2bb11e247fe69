#!/bin/sh
# A measurement probe, not part of Astraeus (benchmarks/README.md, "Fifteenth round"): a worktree of this checkout
# whose shim launcher starts the per-worker supervisor written in C (native_shim.c) instead of forking the Python
# shim, for bench_throughput.py to measure beside this code:
#
#     sh benchmarks/probes/native_shim.sh /tmp/native-probe
#     .venv/bin/python benchmarks/bench_throughput.py --jobs 200 --rounds 4 --was /tmp/native-probe
set -eu
dest=${1:-/tmp/native-probe}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
git -C "$repo" worktree remove --force "$dest" 2>/dev/null || rm -rf "$dest"
git -C "$repo" worktree add --detach "$dest" HEAD
git -C "$dest" apply "$here/native_shim_launcher.patch"
cc -O2 -Wall -o "$dest/src/astraeus/agent/runtime/astraeus-shim-native" "$here/native_shim.c"
echo "probe ready: .venv/bin/python benchmarks/bench_throughput.py --jobs 200 --rounds 4 --was $dest"
