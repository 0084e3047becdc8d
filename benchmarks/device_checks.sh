#!/usr/bin/env bash
# Every CUDA check in one call of a machine with a GPU (docs/development.md, "Device checks"):
# the recorder's synchronizations, bitwise restore and training, norms and step times
# (gpu_check.py), the forensic capture (gpu_forensics.py), the data capture (gpu_data.py),
# and the ground-truth and compiled-model tests trained on the GPU (AUDITLOG_TEST_DEVICE).
#
#   OUT=DIR bash benchmarks/device_checks.sh
#
# The machine's Python must have torch with CUDA; what else auditlog needs and the machine
# lacks comes as wheels in .whl/ (installed into /tmp/site). The source tree is used in
# place: cli/ and migrations/ are linked where an installed package has them.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
ln -sfn ../cli auditlog/cli
ln -sfn ../migrations auditlog/migrations
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import auditlog.cli, torch, duckdb, sqlalchemy; print('torch', torch.__version__, torch.cuda.get_device_name())" || exit 1

status=0
run() {  # name, seconds, command...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1 || { echo "$name: exit $?"; status=1; }
  echo "== $name ($((SECONDS - start)) s)"; tail -n 25 "$OUT/$name.log"
}
run gpu_data 100 python3 benchmarks/gpu_data.py --out "$OUT"
run gpu_check 150 python3 benchmarks/gpu_check.py --out "$OUT"
run gpu_forensics 100 python3 benchmarks/gpu_forensics.py --out "$OUT"
AUDITLOG_TEST_DEVICE=cuda run pytest_cuda 180 python3 -m pytest -q -p no:cacheprovider -n 8 \
  tests/test_ground_truth.py tests/test_ground_truth_trainers.py tests/test_behaviour_compiled.py
exit $status
