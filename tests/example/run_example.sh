#!/usr/bin/env bash
# Usage: run_example.sh BUILD_DIR SOURCE_DIR WORK_DIR TORCH_PREFIX ZOO_PLUGIN
set -euo pipefail
build=$1 src=$2 work=$3 torch_prefix=$4 zoo=$5
rm -rf "$work" && mkdir -p "$work"
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
# The three commands of examples/hello-collator/README.md, with QRUN_PREFIX=$prefix.
cmake -S "$src/examples/hello-collator" -B "$work/hello" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix;$torch_prefix" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
cmake --build "$work/hello" >/dev/null
export QRUN_PLUGIN_PATH="$work/hello:$zoo"
# (Outputs are captured before grep -q: in a pipe, grep -q's early exit can kill the writer with
# SIGPIPE, which pipefail turns into a spurious failure.)
explain=$("$prefix/bin/qrun" plugins explain collator/hello-collator)
grep -q "samples_per_batch" <<< "$explain"
# The installed qrun finds the installed in-tree plugins and the example; run a recipe with it.
cd "$work"
out=$("$prefix/bin/qrun" "$src/tests/example/hello.yaml" 2>&1)
echo "$out"
grep -q "data: 10 samples -> 4 batches (hello-collator)" <<< "$out"
