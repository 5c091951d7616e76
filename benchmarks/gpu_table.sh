#!/bin/sh
# The speed table of a CPU session, on one CUDA GPU, in one short run (about 10 minutes on an H200): the time to a
# verdict (check.py: proved against decoded, and 1,000 rows), the engines on the embedded pair (reference,
# batched-reference, eqspec and exspec at batch size 8) and prompt lookup on summarize+code, then the device
# check (gpu_check.py: equivalence and verdicts in float32 and bfloat16). Each part writes its file into OUT as it
# ends, and a part that fails does not stop the others. vLLM is not part of it: its GPU build is not installed.
#
#     sh benchmarks/gpu_table.sh [OUT]     # OUT defaults to benchmarks/results
out=${1:-benchmarks/results}
mkdir -p "$out"
here=$(dirname "$0")
python3 "$here/check.py" --device cuda --threads 8 --before '' --out "$out/check-gpu.md"
python3 -m specviz.cli bench --prompt-set all --methods reference,batched-reference,eqspec,exspec \
    --batch-sizes 8 --k 5 --max-new-tokens 48 --device cuda --out "$out" --name bench-gpu
python3 -m specviz.cli bench --prompt-set summarize+code --methods reference,batched-reference,eqspec,exspec \
    --drafter lookup --ngram-min 2 --ngram-max 3 --batch-sizes 1,8 --k 5 --max-new-tokens 48 --device cuda \
    --out "$out" --name lookup-gpu
python3 "$here/gpu_check.py" | tee "$out/gpu-check.txt"
