#!/usr/bin/env bash
# Data-parallel training through the trainer, with real processes on the CPU (ranks joined
# over TCP on loopback, the path several hosts use): two ranks at half the batch train as
# one process on the whole batch (the loss of every step, the test accuracy), a checkpoint
# of two ranks resumes on one, replicas stay identical, and failures end the job with a
# message naming the rank: a killed rank (of every task), a wrong address, contradictory flags.
#   bash tests/trainer_parallel_test.sh build/tools/trainer
set -u

TRAINER=${1:?usage: trainer_parallel_test.sh TRAINER_BINARY}
[[ -x $TRAINER ]] || { echo "trainer_parallel_test: '$TRAINER' is not an executable" >&2; exit 1; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kiln_parallel.XXXXXX") || exit 1
trap 'pkill -9 -f "$TMP" 2>/dev/null; rm -rf "$TMP"' EXIT
SCENARIO=""
RC=0

fail() {
  echo "FAIL [$SCENARIO]: $*" >&2
  echo "--- exit code: $RC" >&2
  echo "--- stdout:" >&2; head -c 3000 "$TMP/stdout" >&2
  echo "--- stderr:" >&2; head -c 3000 "$TMP/stderr" >&2
  exit 1
}
run() {  # run NAME ARGS...: the trainer on the CPU, one thread per rank
  SCENARIO=$1
  shift
  timeout 300 "$TRAINER" --device cpu --threads 1 --no-progress "$@" >"$TMP/stdout" 2>"$TMP/stderr" </dev/null
  RC=$?
  ((RC == 124)) && fail "timed out"
  ((RC >= 128)) && fail "crashed (signal $((RC - 128)))"
  return 0
}
common=(--model lenet --synthetic --epochs 1 --lr 0.01 --metrics-every 1)

run "one process, batch 32" "${common[@]}" --max-steps 40 --batch-size 32 --metrics "$TMP/one.jsonl"
((RC == 0)) || fail "exit code $RC"
run "two ranks, batch 16 each" "${common[@]}" --max-steps 40 --batch-size 16 --ranks 2 --check-replicas 10 --metrics "$TMP/two.jsonl" \
  --checkpoint "$TMP/two.safetensors"
((RC == 0)) || fail "exit code $RC"
grep -q "starting 2 ranks" "$TMP/stdout" || fail "no launcher line"
python3 - "$TMP/one.jsonl" "$TMP/two.jsonl" <<'PY' || { SCENARIO="same losses"; fail "the two runs differ"; }
import json, sys
def read(path):
    lines = [json.loads(l) for l in open(path)]
    return [l["loss"] for l in lines if l["kind"] == "step"], [l["test_accuracy"] for l in lines if l["kind"] == "epoch"]
(one, acc1), (two, acc2) = read(sys.argv[1]), read(sys.argv[2])
assert len(one) == len(two) == 40, (len(one), len(two))
worst = max(abs(a - b) / max(abs(a), 1e-6) for a, b in zip(one, two))
print(f"40 steps: largest relative loss difference {worst:.2e}; accuracy {acc1} vs {acc2}")
assert worst < 1e-4, worst
assert one[-1] < one[0], "the loss did not fall"
assert len(acc1) == len(acc2) == 1 and abs(acc1[0] - acc2[0]) <= 0.002
PY

run "a checkpoint of two ranks resumes on one process (same global batch)" "${common[@]}" --batch-size 32 --max-steps 60 \
  --resume "$TMP/two.safetensors"
((RC == 0)) || fail "exit code $RC"
run "another global batch is refused" "${common[@]}" --batch-size 16 --max-steps 60 --resume "$TMP/two.safetensors"
((RC == 1)) && grep -q "steps of 32 examples (batch 16 x 2 ranks x --accumulate 1)" "$TMP/stderr" || fail "no clear refusal"

# kill_rank MODEL RANK ARGS...: two ranks train MODEL; once rank 0 has written three step
# lines, RANK is killed (SIGKILL, as the OOM killer does); the job must end within a minute
# with a non-zero exit and a message naming the rank and the cause.
kill_rank() {
  local model=$1 victim_rank=$2
  shift 2
  SCENARIO="a killed rank $victim_rank ends the $model job"
  local metrics="$TMP/kill-$model.jsonl" victim=""
  timeout 200 "$TRAINER" --device cpu --threads 1 --no-progress --model "$model" "$@" --ranks 2 \
    --init-timeout 20 --metrics-every 1 --metrics "$metrics" >"$TMP/stdout" 2>"$TMP/stderr" </dev/null &
  local launcher=$!
  for _ in $(seq 300); do  # until both ranks train (rank 0 has written step lines); the
    # launcher puts --rank after the given flags, so the pattern is only this job's rank
    victim=$(pgrep -f -- "$metrics --rank $victim_rank --world-size 2" | head -1)
    [[ -n $victim && -f $metrics ]] && (($(wc -l <"$metrics") >= 3)) && break
    sleep 0.2
  done
  [[ -n $victim && -f $metrics ]] || fail "the two ranks never trained"
  local start elapsed
  start=$(date +%s)
  kill -9 "$victim"
  wait "$launcher"
  RC=$?
  elapsed=$(($(date +%s) - start))
  ((RC != 0 && RC != 124)) || fail "the launcher exited with $RC"
  ((elapsed < 60)) || fail "the job took ${elapsed}s to end"
  grep -q "rank $victim_rank" "$TMP/stderr" || fail "no message names rank $victim_rank"
  grep -qi "signal 9\|killed\|died" "$TMP/stderr" || fail "no cause given"
  echo "$model, killed rank $victim_rank: the job ended in ${elapsed}s with exit code $RC:"
  cat "$TMP/stderr"
}
kill_rank lenet 1 --synthetic --epochs 50 --batch-size 16
kill_rank char-lstm 1 --text "$(dirname "$0")/fixtures/lm_corpus.txt" --seq-len 32 --epochs 500 --batch-size 8
kill_rank gan 0 --synthetic --epochs 200 --batch-size 8
kill_rank dcgan 1 --synthetic --epochs 200 --batch-size 8 --sync-batch-norm

# refused_both RANK0_TEXT RANK1_TEXT: both hand-started ranks ended with an error. Each found the
# shapes differ and exits 1 naming its own, unless the other's exit reached it first: then it
# ends as a rank whose peer failed (exit 3, naming that rank). One of them gets to say its own.
refused_both() {
  (( (RC == 1 || RC == 3) && (RC0 == 1 || RC0 == 3) && (RC == 1 || RC0 == 1) )) ||
    fail "exit codes $RC0 and $RC, expected 1 (or 3 for one of them)"
  ((RC0 == 1)) && { grep -qF "$1" "$TMP/stderr" || fail "rank 0 exited 1 without naming its shapes"; }
  ((RC == 1)) && { grep -qF "$2" "$TMP/stderr1" || fail "rank 1 exited 1 without naming its shapes"; }
  ((RC0 == 3)) && { grep -q "rank 1" "$TMP/stderr" || fail "rank 0 exited 3 without naming rank 1"; }
  ((RC == 3)) && { grep -q "rank 0" "$TMP/stderr1" || fail "rank 1 exited 3 without naming rank 0"; }
  return 0
}

# two_ranks "RANK0 FLAGS" "RANK1 FLAGS": lenet started by hand as the two ranks of a job, each
# with its own flags; their exit codes in RC0 and RC, their errors in stderr and stderr1.
two_ranks() {
  local port=$((20000 + RANDOM % 20000)) common=(--device cpu --threads 1 --no-progress --model lenet
    --synthetic --max-steps 2 --world-size 2 --init-timeout 20)
  # shellcheck disable=SC2086 # each rank's flags are words
  "$TRAINER" "${common[@]}" $1 --rank 0 --init "127.0.0.1:$port" >"$TMP/stdout" 2>"$TMP/stderr" </dev/null &
  local rank0=$!
  # shellcheck disable=SC2086
  timeout 60 "$TRAINER" "${common[@]}" $2 --rank 1 --init "127.0.0.1:$port" >/dev/null 2>"$TMP/stderr1" </dev/null
  RC=$?
  wait "$rank0"
  RC0=$?
}

SCENARIO="ranks with different batch sizes are refused"
two_ranks "--batch-size 8" "--batch-size 16"
refused_both "rank 0: --batch-size 8, --seq-len 64 and --accumulate 1 are not every rank's" \
  "rank 1: --batch-size 16, --seq-len 64 and --accumulate 1 are not every rank's"

SCENARIO="ranks with different --accumulate are refused"
two_ranks "--batch-size 8" "--batch-size 8 --accumulate 2"
refused_both "rank 0: --batch-size 8, --seq-len 64 and --accumulate 1 are not every rank's" \
  "rank 1: --batch-size 8, --seq-len 64 and --accumulate 2 are not every rank's"

run "--sync-batch-norm on one process says it changes nothing" --model dcgan --synthetic --max-steps 1 \
  --batch-size 8 --sync-batch-norm --samples-dir "$TMP"
((RC == 0)) && grep -q "one process, whose batch is the global batch already" "$TMP/stderr" || fail "no warning"

run "nobody at the address" --model lenet --synthetic --rank 1 --world-size 2 --init 127.0.0.1:9 --init-timeout 1
((RC == 1)) && grep -q "127.0.0.1:9" "$TMP/stderr" || fail "no clear error"
run "--gpus and --ranks together" --model lenet --synthetic --gpus 2 --ranks 2
((RC == 1)) && grep -q "one of them" "$TMP/stderr" || fail "no clear error"
run "a rank outside the world" --model lenet --synthetic --rank 2 --world-size 2
((RC == 1)) && grep -q "rank 2" "$TMP/stderr" || fail "no clear error"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  run "--gpus without a GPU" --model lenet --synthetic --gpus 1
  ((RC == 1)) && grep -q "device cuda" "$TMP/stderr" || fail "no clear error"
fi
run "sampling is not data parallel" --model char-lstm --sample 10 --ranks 2
((RC == 1)) && grep -q "one process" "$TMP/stderr" || fail "no clear error"
echo "trainer_parallel_test: all scenarios passed"
