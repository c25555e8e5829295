#!/usr/bin/env bash
# The trainer's command line: bad flags exit 2 naming the flag, bad data exits 1 with one
# "trainer: error:" line naming the directory or file, never a crash; good runs exit 0.
#   bash tests/trainer_cli_test.sh build/tools/trainer
# Stops at the first failing scenario and says which one it was.
set -u

TRAINER=${1:?usage: trainer_cli_test.sh TRAINER_BINARY}
[[ -x $TRAINER ]] || { echo "trainer_cli_test: '$TRAINER' is not an executable" >&2; exit 1; }
DATA=/usr/share/datasets/fashion-mnist
LIMIT=${KILN_TRAINER_TEST_TIMEOUT:-300}  # seconds per scenario

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kiln_trainer_cli.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT

SCENARIO=""
RC=0
passed=0
skipped=0

fail() {
  echo "FAIL [$SCENARIO]: $*" >&2
  echo "--- command exit code: $RC" >&2
  echo "--- stdout:" >&2
  head -c 4000 "$TMP/stdout" >&2
  echo "--- stderr:" >&2
  head -c 4000 "$TMP/stderr" >&2
  exit 1
}

# run NAME ARGS...: runs the trainer, keeping its exit code in RC and its output in $TMP/{stdout,stderr}.
run() {
  SCENARIO=$1
  shift
  timeout "$LIMIT" "$TRAINER" "$@" >"$TMP/stdout" 2>"$TMP/stderr" </dev/null
  RC=$?
  if ((RC == 124)); then fail "timed out after ${LIMIT}s"; fi
  if ((RC >= 128)); then fail "crashed (exit code $RC = signal $((RC - 128)))"; fi
}

expect_rc() {
  ((RC == $1)) || fail "expected exit code $1, got $RC"
}

# expect_output TEXT: stdout or stderr contains TEXT (fixed string).
expect_output() {
  cat "$TMP/stdout" "$TMP/stderr" | grep -qF -- "$1" || fail "expected the output to mention '$1'"
}

# expect_error TEXT...: exactly one stderr line starts with "trainer: error:", and it contains every TEXT.
expect_error() {
  local n line
  n=$(grep -c '^trainer: error:' "$TMP/stderr")
  ((n == 1)) || fail "expected exactly one 'trainer: error:' line on stderr, found $n"
  line=$(grep '^trainer: error:' "$TMP/stderr")
  for text in "$@"; do
    [[ $line == *"$text"* ]] || fail "expected the error line to mention '$text'"
  done
  ! grep -q 'internal error' "$TMP/stderr" || fail "an internal error was reported"
}

ok() {
  echo "ok [$SCENARIO]"
  passed=$((passed + 1))
}

skip() {
  echo "skip [$1]: $2"
  skipped=$((skipped + 1))
}

# --- bad flags and values: exit 2, naming the flag -----------------------------------------------

run "unknown flag" --bogus-flag
expect_rc 2
expect_output "--bogus-flag"
ok

run "non-numeric --epochs" --epochs abc
expect_rc 2
expect_output "--epochs"
ok

run "negative --lr" --lr -1
expect_rc 2
expect_output "--lr"
ok

run "unknown --model" --model nosuch
expect_rc 2
expect_output "nosuch"
ok

run "unknown --optimizer" --optimizer foo
expect_rc 2
expect_output "foo"
ok

run "unknown --device" --device gpu
expect_rc 2
expect_output "gpu"
ok

run "--epochs 0" --epochs 0
expect_rc 2
expect_output "--epochs"
ok

run "--momentum out of range" --momentum 2
expect_rc 2
expect_output "--momentum"
ok

# --- bad data: exit 1, one error line naming the directory or file -------------------------------

run "nonexistent data dir" --data-dir /nonexistent/dir --max-steps 1
expect_rc 1
expect_error "/nonexistent/dir" "does not exist"
(($(wc -l <"$TMP/stderr") == 1)) || fail "expected stderr to be the error line alone"
ok

mkdir -p "$TMP/missing"
run "data dir without the IDX files" --data-dir "$TMP/missing" --max-steps 1
expect_rc 1
expect_error "train-images-idx3-ubyte"
ok

# A malformed training images file; the other three files are real when the dataset is there.
mkdir -p "$TMP/garbage"
printf 'this is not an IDX file at all, just some garbage bytes\n' >"$TMP/garbage/train-images-idx3-ubyte"
for f in train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  if [[ -f $DATA/$f.gz ]]; then cp "$DATA/$f.gz" "$TMP/garbage/"; else head -c 64 /dev/urandom >"$TMP/garbage/$f"; fi
done
run "garbage images file" --data-dir "$TMP/garbage" --max-steps 1 --no-progress
expect_rc 1
expect_error "$TMP/garbage/train-images-idx3-ubyte" "not an IDX file"
ok

# Bytes that claim to be gzip but are not a deflate stream.
mkdir -p "$TMP/fakegz"
{ printf '\037\213\010\000\000\000\000\000\000\003'; head -c 4096 /dev/urandom; } >"$TMP/fakegz/train-images-idx3-ubyte.gz"
cp "$TMP/garbage/"{train-labels,t10k-images,t10k-labels}* "$TMP/fakegz/"
run "corrupt gzip images file" --data-dir "$TMP/fakegz" --max-steps 1 --no-progress
expect_rc 1
expect_error "$TMP/fakegz/train-images-idx3-ubyte.gz"
ok

# A header that promises more data than the file has.
mkdir -p "$TMP/short"
{ printf '\000\000\010\003\000\000\352\140\000\000\000\034\000\000\000\034'; head -c 1000 /dev/zero; } >"$TMP/short/train-images-idx3-ubyte"
cp "$TMP/garbage/"{train-labels,t10k-images,t10k-labels}* "$TMP/short/"
run "images file shorter than its header says" --data-dir "$TMP/short" --max-steps 1 --no-progress
expect_rc 1
expect_error "$TMP/short/train-images-idx3-ubyte" "truncated"
ok

# A label outside [0, 10): two images, labels 1 and 12.
mkdir -p "$TMP/badlabel"
{ printf '\000\000\010\003\000\000\000\002\000\000\000\034\000\000\000\034'; head -c 1568 /dev/zero; } >"$TMP/badlabel/train-images-idx3-ubyte"
printf '\000\000\010\001\000\000\000\002\001\014' >"$TMP/badlabel/train-labels-idx1-ubyte"
run "label out of range" --data-dir "$TMP/badlabel" --max-steps 1 --no-progress
expect_rc 1
expect_error "$TMP/badlabel/train-labels-idx1-ubyte" "label 12"
ok

if [[ -f $DATA/train-images-idx3-ubyte.gz ]]; then
  mkdir -p "$TMP/truncated"
  head -c 100000 "$DATA/train-images-idx3-ubyte.gz" >"$TMP/truncated/train-images-idx3-ubyte.gz"
  cp "$DATA/train-labels-idx1-ubyte.gz" "$DATA/t10k-images-idx3-ubyte.gz" "$DATA/t10k-labels-idx1-ubyte.gz" "$TMP/truncated/"
  run "truncated gzip images file" --data-dir "$TMP/truncated" --max-steps 1 --no-progress
  expect_rc 1
  expect_error "$TMP/truncated/train-images-idx3-ubyte.gz"
  grep -qE '^trainer: error:.*(truncated|corrupt)' "$TMP/stderr" || fail "expected the error to say truncated or corrupt"
  ok
else
  skip "truncated gzip images file" "$DATA is not installed"
fi

# --- good runs: exit 0 ---------------------------------------------------------------------------

run "synthetic run" --synthetic --max-steps 3 --epochs 1 --no-progress
expect_rc 0
expect_output "test accuracy"
grep -q 'trainer: error' "$TMP/stderr" && fail "a successful run printed an error"
ok

run "--label-smoothing trains, and its loss is the smoothed one" --synthetic --max-steps 1 \
  --epochs 1 --no-progress --optimizer sgd --metrics "$TMP/smooth.jsonl" --label-smoothing 0.1
expect_rc 0
run "the same without smoothing" --synthetic --max-steps 1 --epochs 1 --no-progress \
  --optimizer sgd --metrics "$TMP/plain.jsonl"
expect_rc 0
python3 - "$TMP/smooth.jsonl" "$TMP/plain.jsonl" <<'PY' || fail "the smoothed loss is not another one"
import json, sys
smooth, plain = ([l["loss"] for l in map(json.loads, open(p)) if l["kind"] == "step"] for p in sys.argv[1:])
assert len(smooth) == len(plain) == 1 and abs(smooth[0] - plain[0]) > 1e-4 * plain[0], (smooth, plain)
PY
ok
run "--label-smoothing out of range" --synthetic --max-steps 1 --label-smoothing 1.5
expect_rc 2
expect_output "--label-smoothing"
ok

run "--help" --help
expect_rc 0
expect_output "--data-dir"
expect_output "--model"
ok

# --- config files, checkpoints, numerics -------------------------------------------------------------

printf '{"epochs": "two"}' > "$TMP/bad_config.json"
run "--config with a wrong type" --config "$TMP/bad_config.json"
expect_rc 2
expect_output "'epochs' must be an integer"
ok

printf '{"synthetic": true, "max-steps": 2, "epochs": 1, "optimizer": "sgd"}' > "$TMP/good_config.json"
run "--config, a flag overriding it" --config "$TMP/good_config.json" --lr 0.02 --no-progress
expect_rc 0
expect_output "sgd lr 0.02"
ok

run "--checkpoint into a missing directory" --synthetic --max-steps 2 --checkpoint /nonexistent/dir/c.safetensors
expect_rc 1
expect_output "the directory /nonexistent/dir does not exist"
ok

run "--checkpoint then --resume" --synthetic --max-steps 2 --epochs 1 --checkpoint "$TMP/c.safetensors" --no-progress
expect_rc 0
[ -f "$TMP/c.safetensors" ] || fail "no checkpoint was written"
ok

run "--resume in another precision says so" --synthetic --max-steps 3 --epochs 1 --resume "$TMP/c.safetensors" --precision bf16 --no-progress
expect_rc 0
expect_output "trained in fp32 so far, continuing in bf16 (master weights and optimizer state are fp32 in both)"
ok

run "--resume with other augmentation says so" --synthetic --max-steps 3 --epochs 1 --resume "$TMP/c.safetensors" --flip --crop-padding 2 --no-progress
expect_rc 0
expect_output "augmentation changes from --crop-padding 0 to --crop-padding 2 --flip"
ok

run "--resume with another --pad is refused" --synthetic --max-steps 3 --epochs 1 --resume "$TMP/c.safetensors" --pad 2 --no-progress
expect_rc 1
expect_error "the checkpoint was trained on images with --pad 0 --image-size 0 but this run has --pad 2 --image-size 0 (the model's input would change)"
ok

run "--tf32 with --precision bf16" --synthetic --max-steps 1 --tf32 --precision bf16
expect_rc 1
expect_error "--tf32 with --precision bf16: --tf32 means --precision tf32"
ok

printf 'not a checkpoint' > "$TMP/broken.safetensors"
run "--resume from a corrupt file" --synthetic --max-steps 2 --resume "$TMP/broken.safetensors"
expect_rc 1
expect_output "broken.safetensors"
ok

run "--check-numerics on a diverging run" --synthetic --optimizer sgd --lr 1e12 --lr-schedule constant --check-numerics --max-steps 20 --no-progress
expect_rc 1
expect_output "check-numerics: run"
ok

# --- GANs ------------------------------------------------------------------------------------------

mkdir -p "$TMP/samples"
run "gan: a synthetic run writes its grid, GAN defaults" --model gan --synthetic --max-steps 3 --epochs 1 --samples-dir "$TMP/samples" --no-progress
expect_rc 0
expect_output "adam lr 0.0002"
expect_output "D accuracy"
[ -s "$TMP/samples/gan-epoch-1.png" ] || fail "no sample grid was written"
ok

run "dcgan: a synthetic run" --model dcgan --synthetic --batch-size 8 --max-steps 2 --epochs 1 --samples-dir "$TMP/samples" --no-progress
expect_rc 0
[ -s "$TMP/samples/dcgan-epoch-1.png" ] || fail "no sample grid was written"
ok

run "gan: a missing --samples-dir" --model gan --synthetic --max-steps 3 --samples-dir "$TMP/nosuch" --no-progress
expect_rc 1
expect_error "--samples-dir" "$TMP/nosuch"
ok

# char-lstm: a short text, a few steps, then a sample from the checkpoint.
for i in $(seq 1 120); do echo "the cat sees the dog, and the dog sees the cat $i."; done > "$TMP/text.txt"
run "char-lstm on a text file, with a checkpoint" --model char-lstm --text "$TMP/text.txt" --hidden 32 --embedding 8 --seq-len 16 \
  --batch-size 8 --max-steps 5 --checkpoint "$TMP/lm.safetensors" --metrics "$TMP/lm.jsonl" --no-progress
expect_rc 0
expect_output "validation"
expect_output "bits/char"
[ -f "$TMP/lm.safetensors" ] || fail "no checkpoint was written"
grep -q '"validation_bits_per_char"' "$TMP/lm.jsonl" || fail "no validation bits per character in the metrics"
ok

run "char-lstm --sample from the checkpoint" --model char-lstm --resume "$TMP/lm.safetensors" --sample 50 --prime "the " --temperature 0.5
expect_rc 0
expect_output "the "
ok

run "char-lstm --sample without --resume" --model char-lstm --sample 10
expect_rc 1
expect_error "--sample needs --resume"
ok

run "--sample for an image classifier" --model lenet --sample 10
expect_rc 2
expect_error "--sample does not apply to model lenet" "char-lstm"
ok

run "a GAN flag for a classifier" --model lenet --fid-classifier x.safetensors
expect_rc 2
expect_error "--fid-classifier does not apply to model lenet" "gan, dcgan"
ok

printf '{"hidden": 32}' > "$TMP/lm_config.json"
run "a language-model key in --config for a classifier" --config "$TMP/lm_config.json" --synthetic
expect_rc 2
expect_error "--hidden does not apply to model lenet"
ok

printf '{"epochs": 1, "epochs": 2}' > "$TMP/twice.json"
run "a key given twice in --config" --config "$TMP/twice.json"
expect_rc 2
expect_error "the key 'epochs' is given twice"
ok

printf '{"lr-gamma": 3}' > "$TMP/gamma.json"
run "--config goes through the same range checks" --config "$TMP/gamma.json"
expect_rc 2
expect_error "'lr-gamma' is 3 but must be in (0, 1]"
ok

run "--lr-gamma out of range on the command line" --lr-gamma 3
expect_rc 2
expect_error "--lr-gamma is 3" "must be in (0, 1]"
ok

run "char-lstm on a missing text" --model char-lstm --text /nonexistent/text.txt
expect_rc 1
expect_error "text file /nonexistent/text.txt does not exist"
ok

printf '\x01\x02' > "$TMP/empty.txt"
run "char-lstm on a text with no vocabulary characters" --model char-lstm --text "$TMP/empty.txt"
expect_rc 1
expect_error "empty.txt is empty"
ok

run "char-lstm --checkpoint into a missing directory" --model char-lstm --text "$TMP/text.txt" --checkpoint /nonexistent/dir/c.safetensors
expect_rc 1
expect_error "the directory /nonexistent/dir does not exist"
ok

run "row-lstm trains a step" --model row-lstm --synthetic --max-steps 2 --epochs 1 --no-progress
expect_rc 0
expect_output "test accuracy"
ok

# --- trainer eval and trainer predict -------------------------------------------------------------

# write_checkpoint FILE METADATA_JSON [TENSOR_NAME SHAPE_JSON]: a small valid safetensors file.
write_checkpoint() {
  python3 - "$@" <<'PY'
import json, struct, sys
path, metadata = sys.argv[1], json.loads(sys.argv[2])
header, data = {'__metadata__': metadata}, b''
if len(sys.argv) > 3:
    shape = json.loads(sys.argv[4])
    count = 1
    for d in shape:
        count *= d
    header[sys.argv[3]] = {'dtype': 'F32', 'shape': shape, 'data_offsets': [0, 4 * count]}
    data = b'\0' * (4 * count)
text = json.dumps(header).encode()
text += b' ' * (-len(text) % 8)
open(path, 'wb').write(struct.pack('<Q', len(text)) + text + data)
PY
}

# The accuracy in "test accuracy 12.34%" of the last such line of stdout.
printed_accuracy() { grep -o 'test accuracy [0-9.]*%' "$TMP/stdout" | tail -1; }

run "train a synthetic checkpoint for eval" --synthetic --max-steps 30 --epochs 1 --checkpoint "$TMP/eval.safetensors" --no-progress
expect_rc 0
trained=$(printed_accuracy)
[[ -n $trained ]] || fail "no test accuracy printed"
ok

run "eval: the same test accuracy as at the end of training" eval --checkpoint "$TMP/eval.safetensors"
expect_rc 0
expect_output "model lenet after 30 steps, synthetic test set of 1000 images"
[[ $(printed_accuracy) == "$trained" ]] || fail "eval printed '$(printed_accuracy)', training '$trained'"
expect_output "test loss"
ok

run "train a bf16 checkpoint" --synthetic --max-steps 30 --epochs 1 --precision bf16 --checkpoint "$TMP/eval16.safetensors" --no-progress
expect_rc 0
trained16=$(printed_accuracy)
ok

run "eval: a bf16 checkpoint evaluates in bf16, as trained" eval --checkpoint "$TMP/eval16.safetensors"
expect_rc 0
expect_output "synthetic test set of 1000 images on cpu in bf16"
[[ $(printed_accuracy) == "$trained16" ]] || fail "eval printed '$(printed_accuracy)', training '$trained16'"
ok

run "eval: --precision fp32 overrides the checkpoint's" eval --checkpoint "$TMP/eval16.safetensors" --precision fp32
expect_rc 0
expect_output "synthetic test set of 1000 images on cpu"
grep -q " in bf16" "$TMP/stdout" && fail "evaluated in bf16 though fp32 was asked for"
ok

run "eval: a missing checkpoint" eval --checkpoint "$TMP/nonexistent.safetensors"
expect_rc 2
expect_output "nonexistent.safetensors"
ok

run "eval: --checkpoint is required" eval
expect_rc 2
expect_output "--checkpoint"
ok

run "eval: a corrupt checkpoint" eval --checkpoint "$TMP/broken.safetensors"
expect_rc 1
expect_error "$TMP/broken.safetensors"
ok

write_checkpoint "$TMP/plain.safetensors" '{}'
run "eval: a safetensors file that is not a training checkpoint" eval --checkpoint "$TMP/plain.safetensors"
expect_rc 1
expect_error "$TMP/plain.safetensors" "not a kiln checkpoint"
ok

write_checkpoint "$TMP/other_model.safetensors" '{"model": "nosuchmodel", "kiln.step": "1", "kiln.epoch": "1", "kiln.batch": "1"}'
run "eval: a checkpoint of a model this trainer does not know" eval --checkpoint "$TMP/other_model.safetensors"
expect_rc 1
expect_error "$TMP/other_model.safetensors" "unknown model 'nosuchmodel'"
ok

write_checkpoint "$TMP/wrong_shapes.safetensors" '{"model": "lenet", "kiln.step": "1", "kiln.epoch": "1", "kiln.batch": "1"}' \
  param/conv1.weight '[16, 1, 5, 5]'
run "eval: a checkpoint whose tensors are not the named model's" eval --checkpoint "$TMP/wrong_shapes.safetensors"
expect_rc 1
expect_error "$TMP/wrong_shapes.safetensors" "param/conv1.weight" "[16, 1, 5, 5]"
ok

# IDX images of the wrong size: u8 [2, 32, 32].
{ printf '\000\000\010\003\000\000\000\002\000\000\000\040\000\000\000\040'; head -c 2048 /dev/zero; } >"$TMP/big-images-idx3-ubyte"
run "predict: images of the wrong size" predict --checkpoint "$TMP/eval.safetensors" --images "$TMP/big-images-idx3-ubyte"
expect_rc 1
expect_error "$TMP/big-images-idx3-ubyte" "28, 28" "[2, 32, 32]"
ok

run "predict: a file that is not IDX" predict --checkpoint "$TMP/eval.safetensors" --images "$TMP/broken.safetensors"
expect_rc 1
expect_error "$TMP/broken.safetensors" "not an IDX file"
ok

run "predict: --images is required" predict --checkpoint "$TMP/eval.safetensors"
expect_rc 2
expect_output "--images"
ok

# Three images: one line each, "class<TAB>name".
{ printf '\000\000\010\003\000\000\000\003\000\000\000\034\000\000\000\034'; head -c 2352 /dev/urandom; } >"$TMP/three-images-idx3-ubyte"
run "predict: one line per image" predict --checkpoint "$TMP/eval.safetensors" --images "$TMP/three-images-idx3-ubyte"
expect_rc 0
(($(wc -l <"$TMP/stdout") == 3)) || fail "expected 3 lines"
grep -qvP '^[0-9]\t(T-shirt/top|Trouser|Pullover|Dress|Coat|Sandal|Shirt|Sneaker|Bag|Ankle boot)$' "$TMP/stdout" && fail "a line is not 'class<TAB>name'"
ok

run "predict: --output into a missing directory" predict --checkpoint "$TMP/eval.safetensors" --images "$TMP/three-images-idx3-ubyte" \
  --output /nonexistent/dir/p.txt
expect_rc 1
expect_error "--output /nonexistent/dir/p.txt"
ok

if [[ -f $DATA/t10k-images-idx3-ubyte.gz ]]; then
  run "train LeNet briefly on Fashion-MNIST" --max-steps 150 --batch-size 32 --epochs 1 --checkpoint "$TMP/real.safetensors" --no-progress
  expect_rc 0
  ok

  run "eval on Fashion-MNIST" eval --checkpoint "$TMP/real.safetensors"
  expect_rc 0
  correct=$(sed -n 's/^test accuracy [0-9.]*% (\([0-9]*\) of 10000).*/\1/p' "$TMP/stdout")
  [[ -n $correct ]] && ((correct >= 6000)) || fail "expected at least 60% test accuracy after 150 steps, got '$correct' of 10000"
  ok

  run "predict on the test images agrees with eval" predict --checkpoint "$TMP/real.safetensors" \
    --images "$DATA/t10k-images-idx3-ubyte.gz" --output "$TMP/predictions.tsv"
  expect_rc 0
  (($(wc -l <"$TMP/predictions.tsv") == 10000)) || fail "expected 10000 predictions"
  # The labels: the bytes after the 8-byte IDX header, one per line.
  gzip -dc "$DATA/t10k-labels-idx1-ubyte.gz" | tail -c +9 | od -An -v -tu1 -w1 | tr -d ' ' >"$TMP/labels.txt"
  agree=$(paste <(cut -f1 "$TMP/predictions.tsv") "$TMP/labels.txt" | awk '$1 == $2' | wc -l)
  ((agree == correct)) || fail "predict matches $agree labels but eval counted $correct correct"
  ok
else
  skip "eval and predict on Fashion-MNIST" "$DATA is not installed"
fi

# Output that cannot be written (a full disk, a closed descriptor) is an error, not a success.
if [[ -w /dev/full ]]; then
  SCENARIO="--help into a full disk"
  timeout "$LIMIT" "$TRAINER" --help >/dev/full 2>"$TMP/stderr" </dev/null
  RC=$?
  : >"$TMP/stdout"
  expect_rc 1
  expect_error "standard output" "incomplete"
  ok
  SCENARIO="predict into a full disk"
  timeout "$LIMIT" "$TRAINER" predict --checkpoint "$TMP/eval.safetensors" \
    --images "$TMP/three-images-idx3-ubyte" >/dev/full 2>"$TMP/stderr" </dev/null
  RC=$?
  expect_rc 1
  expect_error "standard output"
  ok
else
  skip "output into a full disk" "/dev/full is not writable here"
fi
SCENARIO="training with standard output closed"
timeout "$LIMIT" "$TRAINER" --model lenet --synthetic --max-steps 1 --batch-size 8 \
  >&- 2>"$TMP/stderr" </dev/null
RC=$?
expect_rc 1
expect_error "standard output"
ok

# Special files as inputs are refused at once, never read until a writer comes or forever.
mkfifo "$TMP/fifo"
run "--config a FIFO" --config "$TMP/fifo"
expect_rc 2
expect_error "$TMP/fifo" "is a FIFO, not a regular file"
ok
run "--text a FIFO" --model char-lstm --text "$TMP/fifo" --max-steps 1
expect_rc 1
expect_error "$TMP/fifo" "is a FIFO, not a regular file"
ok
run "--checkpoint a FIFO, refused before training" --model lenet --synthetic --max-steps 1 \
  --checkpoint "$TMP/fifo"
expect_rc 1
expect_error "$TMP/fifo" "is a FIFO; refusing to replace it"
[[ -p $TMP/fifo ]] || fail "the FIFO was replaced"
! grep -q '^epoch' "$TMP/stderr" "$TMP/stdout" || fail "it trained before refusing"
ok
run "--text a character device" --model char-lstm --text /dev/urandom --max-steps 1
expect_rc 1
expect_error "/dev/urandom" "is a character device, not a regular file"
ok

# --- image data: folders, CIFAR, models that cannot take the data -----------------------------
# write_bmp PATH SEED: an 8x8 24-bit BMP whose colours follow the seed.
write_bmps() {
  python3 - "$@" <<'PY'
import struct, sys
for arg in sys.argv[1:]:
    path, seed = arg.rsplit(':', 1)
    seed = int(seed)
    rows = b''.join(bytes((seed * 40 + x * 9 + y * 5 + c * 70) % 256 for x in range(8) for c in range(3)) for y in range(8))
    header = b'BM' + struct.pack('<IHHI', 54 + len(rows), 0, 0, 54)
    info = struct.pack('<IiiHHIIiiII', 40, 8, 8, 1, 24, 0, len(rows), 2835, 2835, 0, 0)
    open(path, 'wb').write(header + info + rows)
PY
}
mkdir -p "$TMP/photos/train/cats" "$TMP/photos/train/dogs" "$TMP/photos/test/cats" "$TMP/photos/test/dogs"
write_bmps "$TMP/photos/train/cats/a.bmp:1" "$TMP/photos/train/cats/b.bmp:2" "$TMP/photos/train/dogs/c.bmp:3" \
  "$TMP/photos/train/dogs/d.bmp:4" "$TMP/photos/test/cats/e.bmp:5" "$TMP/photos/test/dogs/f.bmp:6"
run "a folder of images trains resnet and saves its class names" --model resnet --data "folder:$TMP/photos" \
  --batch-size 2 --epochs 1 --no-progress --checkpoint "$TMP/photos.safetensors"
expect_rc 0
expect_output "epoch 1:"
ok
run "predict: image files print file, class and the folder's name" predict \
  --checkpoint "$TMP/photos.safetensors" --images "$TMP/photos/test/cats/e.bmp" "$TMP/photos/test/dogs/f.bmp"
expect_rc 0
(($(wc -l <"$TMP/stdout") == 2)) || fail "expected 2 lines"
grep -qvP '^\S+/[ef]\.bmp\t[01]\t(cats|dogs)$' "$TMP/stdout" && fail "a line is not 'file<TAB>class<TAB>name'"
ok
run "eval: a folder-trained checkpoint evaluates on its folder" eval --checkpoint "$TMP/photos.safetensors"
expect_rc 0
expect_output "folder test set of 2 images"
ok
run "predict: a missing image file" predict --checkpoint "$TMP/photos.safetensors" \
  --images "$TMP/broken.safetensors.png"
expect_rc 2
ok
printf 'not a png' >"$TMP/photos/train/dogs/x.png"
run "a folder with an image that does not decode" --model resnet --data "folder:$TMP/photos" --max-steps 1
expect_rc 1
expect_error "$TMP/photos/train/dogs/x.png" "not an image stb_image can decode"
ok
rm "$TMP/photos/train/dogs/x.png"
mkdir -p "$TMP/photos/train/birds"
run "a class folder with no images" --model resnet --data "folder:$TMP/photos" --max-steps 1
expect_rc 1
expect_error "$TMP/photos/train/birds" "a class folder with no images"
ok
rmdir "$TMP/photos/train/birds"
run "lenet refuses images it cannot take" --model lenet --data "folder:$TMP/photos" --max-steps 1
expect_rc 1
expect_error "model lenet takes only [1, 28, 28] images in 10 classes" "[3, 8, 8] in 2 classes"
ok
mkdir -p "$TMP/cifar"
head -c 3073 /dev/zero >"$TMP/cifar/data_batch_1.bin"
head -c 3000 /dev/zero >"$TMP/cifar/data_batch_2.bin"
run "CIFAR-10: a truncated record names the file" --model resnet18 --data "cifar10:$TMP/cifar" --max-steps 1
expect_rc 1
expect_error "$TMP/cifar/data_batch_2.bin: truncated record"
ok
run "--data: an unknown source" --model resnet --data "imagenet:$TMP" --max-steps 1
expect_rc 1
expect_error "is not a data source" "cifar10:DIR"
ok

echo "trainer_cli_test: $passed scenarios passed, $skipped skipped"
