#!/usr/bin/env bash
# STAPO's cost and memory on one GPU at vocabulary 151,936, on a random-weight and a trained-like model (silencing
# ~1e-4 of loss tokens), in three layouts (benchmarks/gpu.py; its docstring says what is measured).
#
#   bash scripts/gpu_check.sh               # on the GPU machine, from the repository root, with .whl/ carried
#   bash scripts/gpu_check.sh --cpu-smoke   # here: the same path at toy size on the CPU, with .venv/bin/python
#
# One run is meant to fit 6 minutes on an H200: benchmarks/gpu.py starts no trainer run that would end past
# --max-seconds (300 s of its own; the wheels and imports come on top). Further arguments go to benchmarks/gpu.py
# (--reps, --max-seconds, --trained-silenced, ...); a second run on the same warm machine adds repetitions. Writes into
# $OUT (default outputs/gpu-check): env.txt (nvidia-smi, versions), gpu_check.log, gpu.json, gpu.md. Afterwards, here:
#   .venv/bin/python benchmarks/gpu.py --report <OUT>/gpu.json    # -> benchmarks/results/<run date>-gpu.md (+ .json)
# On the GPU machine the packages its Python lacks come from .whl/ (scripts/gpu_wheels.txt lists them and how to fetch
# them), installed into /tmp/site; stapo_trl runs from this checkout (PYTHONPATH), not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-outputs/gpu-check}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 GPU_CHECK_COMMAND="bash scripts/gpu_check.sh $*"
if [[ " $* " == *" --cpu-smoke "* ]]; then
  PY=${PY:-.venv/bin/python}
else
  PY=${PY:-python3}
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
{
  nvidia-smi || echo "nvidia-smi: not found"
  "$PY" -c '
import importlib.metadata as m, sys
for name in sys.argv[1:]:
    try:
        print(name, m.version(name))
    except m.PackageNotFoundError:
        print(name, "not installed")
import stapo_trl.trainer.trainers, trl, datasets, math_verify  # the imports the run needs, before the run
print("imports ok: stapo_trl.trainer.trainers, trl, datasets, math_verify")
' torch triton transformers trl accelerate datasets tokenizers huggingface_hub safetensors peft math-verify \
    latex2sympy2_extended antlr4-python3-runtime numpy pyarrow pandas fsspec regex dill multiprocess xxhash
} 2>&1 | tee "$OUT/env.txt"
"$PY" benchmarks/gpu.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.log"
