#!/usr/bin/env python3
# Behaviour pinned by a recording: every zoo model's first 50 CPU training steps must give
# bitwise the losses in tests/fixtures/first_losses.json (float32 bit patterns, recorded
# from the build before the training loops were merged into one; re-recorded when the CPU's
# float32 convolutions and matmuls moved to oneDNN and reductions to 8 lanes, issue 20; row-lstm
# and char-lstm again when the LSTM recurrence's GEMMs moved to oneDNN's sgemm: 9 of their
# 100 losses moved by one unit in the last place; resnet, vgg, inception and dcgan when batch
# norm's statistics became one pass over shifted values, on an AMD family 26 CPU, their
# family 25 recordings dropped; resnet, vgg and alexnet when 3x3 layers of 64 and more channels
# moved to Winograd, family 26, alexnet's family 25 recording dropped; lenet, resnet, vgg and
# inception when first layers over one channel moved to kiln's direct kernels, family 26,
# lenet's family 25 recording dropped; an AVX2 family 25 model 1, where CI may also run and the
# test had skipped itself, added with --record-cpu from 485c9e4, whose CPU kernels are those of
# 1966d2b, which gives the main recording's bits on the AVX-512 CPUs).
#   loss_fixture_test.py TRAINER [MODEL...]            check (all models by default)
#   loss_fixture_test.py TRAINER --record [MODEL...]   write the fixture from this build
# Float summation order follows the vector width the build was compiled for (KILN_MARCH
# native) and the kernels oneDNN picks for the microarchitecture: a CPU model with a recording
# of its own (the fixture's "by_cpu", keyed by cpu_identity(); --record-cpu adds this CPU's from
# a build whose CPU kernels are unchanged) is checked against it; any other is checked against
# the main recording if it has the same vector extensions, else skipped (exit 77).
#   loss_fixture_test.py TRAINER --record-cpu [MODEL...]   add this CPU model's recording
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "fixtures", "first_losses.json")
CORPUS = os.path.join(HERE, "fixtures", "lm_corpus.txt")
STEPS = 50

# Small batches on one thread: a few seconds per model, bitwise stable.
COMMON = ["--max-steps", str(STEPS), "--batch-size", "8", "--threads", "1", "--device", "cpu",
          "--no-progress", "--metrics-every", "1", "--seed", "7"]
CLASSIFIER = ["--synthetic", "--eval-batch", "250"]
MODELS = {
    "lenet": CLASSIFIER,
    "resnet": CLASSIFIER,
    "vgg": CLASSIFIER,
    "alexnet": CLASSIFIER,
    "inception": CLASSIFIER,
    "row-lstm": CLASSIFIER,
    "char-lstm": ["--text", "@CORPUS@", "--seq-len", "32", "--epochs", "10"],
    "gan": ["--synthetic"],
    "dcgan": ["--synthetic"],
}
# The loss keys of each step line: GANs report both programs' losses.
LOSS_KEYS = {"gan": ["d_loss", "g_loss"], "dcgan": ["d_loss", "g_loss"]}


def vector_extensions():
    """The CPU's vector extensions that change Eigen's and the kernels' summation order."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        flags = []
    return " ".join(sorted(f for f in set(flags) if f in ("avx2", "fma", "avx512f")))


def cpu_identity():
    """Vendor, family and model of this CPU with its vector extensions."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return (f"{fields.get('vendor_id', '?')} family {fields.get('cpu family', '?')} "
            f"model {fields.get('model', '?')}: {vector_extensions()}")


def recording_for_this_cpu(fixture):
    """This CPU model's own recording ({model: {key: bits}}), or None."""
    return fixture.get("by_cpu", {}).get(cpu_identity())


def float_bits(value):
    """The float32 bit pattern of a loss written as a double (losses are f32 tensors)."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    if struct.unpack("<f", struct.pack("<I", bits))[0] != value:
        raise AssertionError(f"loss {value!r} is not a float32 value")
    return f"{bits:08x}"


def train(trainer, model, flags, workdir):
    metrics = os.path.join(workdir, model + ".jsonl")
    args = [trainer, "--model", model, "--metrics", metrics]
    args += [CORPUS if f == "@CORPUS@" else f for f in flags]
    done = subprocess.run(args, cwd=workdir, capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"{model}: trainer exited {done.returncode}: {done.stderr.strip()}")
    with open(metrics) as f:
        lines = [json.loads(line) for line in f]
    steps = [line for line in lines if line["kind"] in ("step", "train")]
    if [line["step"] for line in steps] != list(range(1, STEPS + 1)):
        raise AssertionError(f"{model}: expected step lines 1..{STEPS}, got "
                             f"{[line['step'] for line in steps]}")
    return {key: [float_bits(line[key]) for line in steps]
            for key in LOSS_KEYS.get(model, ["loss"])}


def main():
    trainer, rest = os.path.abspath(sys.argv[1]), sys.argv[2:]
    record, record_cpu = "--record" in rest, "--record-cpu" in rest
    models = [m for m in rest if m not in ("--record", "--record-cpu")] or list(MODELS)
    fixture = {}
    if os.path.exists(FIXTURE):
        with open(FIXTURE) as f:
            fixture = json.load(f)
    own = recording_for_this_cpu(fixture)
    if not record and not record_cpu and own is None and fixture.get("cpu") != vector_extensions():
        print(f"skipped: recorded on a CPU with '{fixture.get('cpu')}', "
              f"this one is '{cpu_identity()}'")
        return 77
    if record:
        fixture["cpu"] = vector_extensions()
    failures = []
    with tempfile.TemporaryDirectory() as workdir:
        for model in models:
            flags = COMMON + MODELS[model]
            got = train(trainer, model, flags, workdir)
            if record:
                fixture[model] = {"flags": flags, **got}
                print(f"{model}: recorded {STEPS} steps")
                continue
            if record_cpu:
                fixture.setdefault("by_cpu", {}).setdefault(cpu_identity(), {})[model] = got
                print(f"{model}: recorded {STEPS} steps for {cpu_identity()}")
                continue
            before = len(failures)
            if fixture[model]["flags"] != flags:
                failures.append(f"{model}: the fixture was recorded with {fixture[model]['flags']}")
                continue
            if own is not None and model not in own:
                # A change of numerics re-recorded on another CPU model: this one's bits are
                # unknown until someone records them here (--record-cpu MODEL).
                print(f"{model}: skipped, no recording for {cpu_identity()}")
                continue
            want = own[model] if own is not None else fixture[model]
            for key, bits in got.items():
                first = next((i for i, (a, b) in enumerate(zip(bits, want[key])) if a != b), None)
                if first is not None:
                    failures.append(f"{model}: {key} of step {first + 1} is 0x{bits[first]}, "
                                    f"recorded 0x{want[key][first]}")
            print(f"{model}: {'differs' if len(failures) > before else 'ok'}")
    if record or record_cpu:
        with open(FIXTURE, "w") as f:
            json.dump(fixture, f, indent=1, sort_keys=True)
            f.write("\n")
    for failure in failures:
        print("FAIL", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
