#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU machine's half of the program C API device-pointer check (prepare.sh is the other):
#
#   run(command="bash tests/consumer/gpu/run.sh", carry=[".dev/capi"])
#
# Runs .dev/capi/bin/check_program_cuda on .dev/capi/cases twice: with KilnBackend on cuda:0
# (host pointers, device pointers, mixed, refusals) and on cpu (host pointers and the refusals:
# the same programs through Kiln's CPU engine). Nothing is compiled. Prints one line per check and
# "N passed, N failed" last; logs (run.log, cuda.log, cpu.log) go to $OUT (or .dev/capi/out).
# Exit status 0 only when every check passed.
set -uo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../../.." && pwd -P)
dev="$root/.dev/capi"
OUT=${OUT:-$dev/out}
mkdir -p "$OUT"

main() {
  if [[ ! -x $dev/bin/check_program_cuda ]]; then
    echo "run: $dev/bin/check_program_cuda is missing: run tests/consumer/gpu/prepare.sh here and carry .dev/capi"
    echo "0 passed, 1 failed"
    return 1
  fi
  cat "$dev/MANIFEST" 2>/dev/null | head -3
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
  local cudnn
  cudnn=$(python3 -c "import nvidia.cudnn as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null || true)
  export LD_LIBRARY_PATH="$dev/bin:/usr/local/cuda/lib64${cudnn:+:$cudnn}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export KILN_CUDA_PLUGIN="$dev/bin/libkiln_cuda.so"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  local pass=0 fail=0 rc dev_opt log
  for dev_opt in cuda:0 cpu; do
    log="$OUT/${dev_opt%%:*}.log"
    echo "=== check_program_cuda --device $dev_opt"
    timeout --kill-after=10 240 "$dev/bin/check_program_cuda" "$dev/cases" --device "$dev_opt" >"$log" 2>&1
    rc=$?
    grep -E '^(PASS|FAIL) ' "$log" | sed "s/^/[$dev_opt] /"
    pass=$((pass + $(grep -c '^PASS ' "$log")))
    fail=$((fail + $(grep -c '^FAIL ' "$log")))
    # cpu: 0 (77 only on a machine without a GPU); cuda:0 must be 0.
    if [[ $rc -ne 0 && ! ($dev_opt == cpu && $rc -eq 77) ]]; then
      echo "FAIL [$dev_opt] check_program_cuda exit status $rc; last lines of $log:"
      grep -v -E '^(PASS|FAIL) ' "$log" | tail -15
      fail=$((fail + 1))
    fi
  done
  echo "$pass passed, $fail failed"
  [[ $fail -eq 0 ]]
}

main 2>&1 | tee "$OUT/run.log"
exit "${PIPESTATUS[0]}"
