#!/usr/bin/env python3
"""Hostile input to trainer and bench (issue 22): divergence, flag values, resume positions and
metadata, deep JSON, a newline in a path, an interrupted predict --output.

Each scenario runs the real binary in a fresh directory and checks its exit code, that stderr
has exactly one "<tool>: error:" line holding the expected texts (no internal error, no
crash), and that no file outside the one it may write was created, changed or removed.

    python3 tests/hostile_input_test.py build/tools/trainer build/tools/bench build/tools/dump
"""
import hashlib
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

TIMEOUT = 300
passed = 0


def fail(name, message, result=None):
    print(f'FAIL [{name}]: {message}', file=sys.stderr)
    if result is not None:
        print(f'--- exit code {result.returncode}\n--- stdout:\n{result.stdout[-3000:]}'
              f'\n--- stderr:\n{result.stderr[-3000:]}', file=sys.stderr)
    sys.exit(1)


def snapshot(folder):
    """Every file under `folder` (relative path -> kind and content hash)."""
    files = {}
    for root, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = os.path.join(root, name)
            key = os.path.relpath(path, folder)
            if os.path.islink(path) or not os.path.isfile(path):
                files[key] = ('special', os.lstat(path).st_mode)
            else:
                with open(path, 'rb') as f:
                    files[key] = ('file', hashlib.sha256(f.read()).hexdigest())
    return files


def run(name, binary, args, rc, texts=(), folder=None, may_change=(), env=None, usage=False):
    """Runs `binary args` in `folder`; checks rc, the one error line (for `usage`, CLI11's
    message instead) and the files."""
    before = snapshot(folder)
    result = subprocess.run([binary] + args, cwd=folder, capture_output=True, text=True,
                            errors='replace', timeout=TIMEOUT, stdin=subprocess.DEVNULL,
                            env=dict(os.environ, **(env or {})))
    if result.returncode < 0 or result.returncode >= 128:
        fail(name, f'crashed (exit code {result.returncode})', result)
    if result.returncode != rc:
        fail(name, f'expected exit code {rc}', result)
    tool = os.path.basename(binary)
    lines = [l for l in result.stderr.splitlines() if l.startswith(f'{tool}: error:')]
    if usage:
        for text in texts:
            if text not in result.stderr:
                fail(name, f'expected the usage message to mention {text!r}', result)
    elif rc != 0:
        if len(lines) != 1:
            fail(name, f'expected one "{tool}: error:" line, found {len(lines)}', result)
        for text in texts:
            if text not in lines[0]:
                fail(name, f'expected the error line to mention {text!r}', result)
    if 'internal error' in result.stderr:
        fail(name, 'an internal error was reported', result)
    after = snapshot(folder)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    if changed - set(may_change):
        fail(name, f'files outside {sorted(may_change)} changed: {sorted(changed)}', result)
    global passed
    passed += 1
    print(f'ok [{name}]')
    return result


# --- safetensors files, read and rewritten with the standard library --------------------------

def read_safetensors(path):
    with open(path, 'rb') as f:
        data = f.read()
    (length,) = struct.unpack('<Q', data[:8])
    return json.loads(data[8:8 + length]), bytearray(data[8 + length:])


def write_safetensors(path, header, body):
    text = json.dumps(header).encode()
    text += b' ' * (-len(text) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(text)) + text + bytes(body))


def doctored(source, target, metadata=None, drop=(), poison=None):
    """A copy of checkpoint `source` with metadata keys replaced or dropped, and the first
    float of the tensor named `poison` set to infinity."""
    header, body = read_safetensors(source)
    header['__metadata__'].update(metadata or {})
    for key in drop:
        header['__metadata__'].pop(key, None)
    if poison is not None:
        begin = header[poison]['data_offsets'][0]
        body[begin:begin + 4] = struct.pack('<f', math.inf)
    write_safetensors(target, header, body)


def idx_images(path, count):
    with open(path, 'wb') as f:
        f.write(bytes([0, 0, 8, 3]) + struct.pack('>3I', count, 28, 28) + bytes(784 * count))


def main():
    trainer, bench, dump = (os.path.abspath(a) for a in sys.argv[1:4])
    with tempfile.TemporaryDirectory(prefix='kiln_hostile.') as top:
        def folder(name):
            path = os.path.join(top, name)
            os.makedirs(path)
            return path

        divergence(trainer, folder)
        flag_values(trainer, bench, folder)
        resume_positions(trainer, folder)
        deep_json_and_paths(trainer, folder)
        predict_output(trainer, folder)
        tool_outputs(bench, dump, folder)
    print(f'hostile_input_test: {passed} scenarios passed')


LENET = ['--model', 'lenet', '--synthetic', '--device', 'cpu', '--no-progress']
TEXT = 'the quick brown fox jumps over the lazy dog. ' * 400
LM = ['--model', 'char-lstm', '--device', 'cpu', '--no-progress', '--hidden', '16',
      '--embedding', '8', '--seq-len', '16', '--batch-size', '8', '--text', 'text.txt']


def divergence(trainer, folder):
    d = folder('divergence')
    run('lenet at --lr 1e6: the exploding loss stops the run, no checkpoint', trainer,
        LENET + ['--epochs', '1', '--lr', '1e6', '--max-steps', '50', '--checkpoint', 'c.safetensors'], 1,
        ['training diverged: loss is', 'at epoch 1 step 2', 'times the first step'], d)
    with open(os.path.join(d, 'text.txt'), 'w') as f:
        f.write(TEXT)
    run('char-lstm at --lr 1e6: diverged', trainer, LM + ['--lr', '1e6', '--max-steps', '30'], 1,
        ['training diverged: loss is', 'at epoch 1 step'], d)
    run('gan at --lr 1e6: diverged', trainer,
        ['--model', 'gan', '--synthetic', '--device', 'cpu', '--no-progress', '--lr', '1e6',
         '--max-steps', '30', '--samples-dir', '.'], 1, ['training diverged: loss is'], d)
    # Adam's second moments at Inf leave the loss finite (the update is 0): the state check
    # before the save refuses to write it and keeps the previous checkpoint.
    run('a good checkpoint to start from', trainer,
        LENET + ['--max-steps', '2', '--checkpoint', 'good.safetensors'], 0, folder=d,
        may_change=['good.safetensors'])
    header, _ = read_safetensors(os.path.join(d, 'good.safetensors'))
    moment = sorted(k for k in header if k.startswith('state/') and k.endswith('.v'))[0]
    doctored(os.path.join(d, 'good.safetensors'), os.path.join(d, 'inf.safetensors'),
             poison=moment)
    run('Inf in the optimizer state: the checkpoint is not written', trainer,
        LENET + ['--max-steps', '4', '--resume', 'inf.safetensors', '--checkpoint',
                 'good.safetensors'], 1,
        ['training diverged: ' + moment[len('state/'):] + ' holds inf', 'after step 4 of the run',
         'the checkpoint good.safetensors was not written (the previous one is kept)'], d)


def flag_values(trainer, bench, folder):
    d = folder('flags')
    cases = [
        ('--seed 2^64 is out of range, not wrapped', ['--seed', '18446744073709551616'],
         ["--seed: '18446744073709551616' is out of range (an integer from 0 to "
          "18446744073709551615)"]),
        ('--seed -1 is refused', ['--seed', '-1'], ['--seed is -1 but must be at least 0']),
        ('--lr 1e-310: an accurate message', ['--lr', '1e-310'],
         ["--lr: '1e-310' is too close to 0 to be held exactly"]),
        ('--threads 100000: a range the program can run', ['--threads', '100000'],
         ['--threads is 100000 but must be in [0, 4096]']),
        ('--hidden for lenet names the flag', ['--model', 'lenet', '--hidden', '8'],
         ['--hidden does not apply to model lenet']),
        ('--hidden for row-lstm names the flag', ['--model', 'row-lstm', '--hidden', '8'],
         ['--hidden does not apply to model row-lstm']),
        ('a training flag before eval', ['--epochs', '1', 'eval', '--checkpoint', 'x'],
         ['--epochs is a training flag: it does not apply to trainer eval']),
    ]
    with open(os.path.join(d, 'x'), 'w') as f:
        f.write('x')
    for name, args, texts in cases:
        run(name, trainer, args, 2, texts, d)
    run('eval --threads 100000', trainer, ['eval', '--checkpoint', 'x', '--threads', '100000'], 2,
        ['--threads', '100000'], d, usage=True)
    for name, doc, texts in [
            ('--config: a value out of its flag range', '{"momentum": 5}',
             ["c.json: 'momentum' is 5 but must be in [0, 1]"]),
            ('--config: a duplicate key', '{"lr": 0.1, "lr": 0.2}',
             ["c.json: the key 'lr' is given twice"]),
            ('--config: --hidden in range', '{"model": "char-lstm", "hidden": 100000000000}',
             ["c.json: 'hidden' is 100000000000 but must be in [1, 16384]"])]:
        with open(os.path.join(d, 'c.json'), 'w') as f:
            f.write(doc)
        run(name, trainer, ['--config', 'c.json'], 2, texts, d)
    run('--config for eval', trainer, ['--config', 'c.json', 'eval', '--checkpoint', 'x'], 2,
        ['--config does not apply to trainer eval'], d)
    for name, args in [('bench --warmup -1', ['--warmup', '-1']),
                       ('bench --threads 100000', ['--threads', '100000']),
                       ('bench --batch-size 0', ['--batch-size', '0'])]:
        run(name, bench, args, 2, [args[0]], d, usage=True)
    run('KILN_CPU_WINOGRAD=off is refused, named, not taken as on', trainer,
        ['--model', 'resnet', '--synthetic', '--device', 'cpu', '--no-progress', '--max-steps',
         '1', '--threads', '1'], 1, ["KILN_CPU_WINOGRAD='off' is not 0 (never) or 1"], d,
        env={'KILN_CPU_WINOGRAD': 'off'})


def resume_positions(trainer, folder):
    d = folder('resume')
    run('a checkpoint to resume', trainer,
        LENET + ['--epochs', '2', '--max-steps', '3', '--checkpoint', 'c.safetensors'], 0,
        folder=d, may_change=['c.safetensors'])
    c = os.path.join(d, 'c.safetensors')
    cases = [
        ('kiln.batch beyond an epoch', {'kiln.batch': '999999', 'kiln.step': '999999'},
         ['--resume bad.safetensors: its position is batch 999999 of epoch 1, but an epoch of '
          'this run has 64 batches']),
        ('kiln.step near 2^63', {'kiln.step': '9223372036854775800'},
         ["bad.safetensors: metadata 'kiln.step' is '9223372036854775800', not an integer from 0"]),
        ('kiln.step inconsistent with epoch and batch', {'kiln.step': '50'},
         ['--resume bad.safetensors: its position is inconsistent: step 50 is not batch 3 of '
          'epoch 1']),
        ('kiln.epoch past --epochs', {'kiln.epoch': '3', 'kiln.batch': '0', 'kiln.step': '128'},
         ['--resume bad.safetensors: the checkpoint is at the end of epoch 2 (step 128): nothing '
          'is left to train in --epochs 2']),
        ('kiln.epoch 0', {'kiln.epoch': '0'}, ["bad.safetensors: metadata 'kiln.epoch' is '0'"]),
        ('model contradicting kiln.config', {'model': 'vgg'},
         ["bad.safetensors: its metadata 'model' is 'vgg' but its kiln.config is of model "
          "'lenet'"]),
    ]
    for name, metadata, texts in cases:
        doctored(c, os.path.join(d, 'bad.safetensors'), metadata)
        run('resume: ' + name, trainer, LENET + ['--epochs', '2', '--resume', 'bad.safetensors'], 1,
            texts, d)
    doctored(c, os.path.join(d, 'bad.safetensors'), {'model': 'vgg'})
    run('eval: model contradicting kiln.config', trainer, ['eval', '--checkpoint',
                                                            'bad.safetensors'], 1,
        ["bad.safetensors: its metadata 'model' is 'vgg'"], d)
    run('resume at --max-steps already reached', trainer,
        LENET + ['--epochs', '2', '--max-steps', '3', '--resume', 'c.safetensors'], 1,
        ['--resume c.safetensors: the checkpoint is at step 3: nothing is left to train with '
         '--max-steps 3'], d)
    # A language model's checkpoint from before kiln.config: loose keys, checked as flags are.
    with open(os.path.join(d, 'text.txt'), 'w') as f:
        f.write(TEXT)
    run('a char-lstm checkpoint', trainer, LM + ['--max-steps', '2', '--checkpoint',
                                                 'lm.safetensors'], 0, folder=d,
        may_change=['lm.safetensors'])
    for value, text in [('-1', "metadata 'hidden' is -1 but must be in [1, 16384]"),
                        ('abc', "metadata 'hidden': 'abc' is not an integer"),
                        ('100000000000', "metadata 'hidden' is 100000000000 but must be in")]:
        doctored(os.path.join(d, 'lm.safetensors'), os.path.join(d, 'old.safetensors'),
                 {'hidden': value}, drop=['kiln.config'])
        run(f'--sample from an old LM checkpoint with hidden {value}', trainer,
            ['--model', 'char-lstm', '--resume', 'old.safetensors', '--sample', '5'], 1,
            ['old.safetensors: ' + text], d)


def deep_json_and_paths(trainer, folder):
    d = folder('json')
    deep = '[' * 200000 + ']' * 200000
    with open(os.path.join(d, 'deep.json'), 'w') as f:
        f.write('{"lr": ' + deep + '}')
    run('--config nested 200,000 deep', trainer, ['--config', 'deep.json'], 2,
        ['deep.json: arrays and objects nested more than 32 deep'], d)
    run('a checkpoint', trainer, LENET + ['--max-steps', '1', '--checkpoint', 'c.safetensors'], 0,
        folder=d, may_change=['c.safetensors'])
    doctored(os.path.join(d, 'c.safetensors'), os.path.join(d, 'deep.safetensors'),
             {'kiln.config': deep})
    for name, args in [('eval', ['eval', '--checkpoint', 'deep.safetensors']),
                       ('--resume', LENET + ['--resume', 'deep.safetensors'])]:
        run(f'{name}: kiln.config nested 200,000 deep', trainer, args, 1,
            ["deep.safetensors: metadata 'kiln.config': arrays and objects nested more than 32 "
             "deep"], d)
    run('a newline in a path stays on the one error line', trainer,
        ['--config', 'two\nlines.json'], 2, ['two\\nlines.json'], d)


def predict_output(trainer, folder):
    d = folder('predict')
    run('a classifier', trainer, LENET + ['--max-steps', '1', '--checkpoint', 'c.safetensors'], 0,
        folder=d, may_change=['c.safetensors'])
    idx_images(os.path.join(d, 'images'), 500)
    with open(os.path.join(d, 'out.txt'), 'w') as f:
        f.write('the previous predictions\n')
    run('predict --output on a full disk keeps the previous file', trainer,
        ['predict', '--checkpoint', 'c.safetensors', '--images', 'images', '--output', 'out.txt'],
        1, ['out.txt', 'No space left on device'], d, env={'KILN_FAKE_DISK_FULL_AFTER': '100'})
    os.mkfifo(os.path.join(d, 'fifo'))
    run('predict --output at a FIFO is refused and kept', trainer,
        ['predict', '--checkpoint', 'c.safetensors', '--images', 'images', '--output', 'fifo'], 1,
        ['fifo', 'is a FIFO'], d)
    run('predict --output replaces the file whole', trainer,
        ['predict', '--checkpoint', 'c.safetensors', '--images', 'images', '--output', 'out.txt'],
        0, folder=d, may_change=['out.txt'])
    with open(os.path.join(d, 'out.txt')) as f:
        if len(f.read().splitlines()) != 500:
            fail('predict --output', 'expected 500 lines')


def tool_outputs(bench, dump, folder):
    d = folder('outputs')
    os.mkfifo(os.path.join(d, 'fifo'))
    run('dump -o at a FIFO is refused and kept', dump, ['--model', 'lenet', '-o', 'fifo'], 1,
        ['fifo', 'is a FIFO'], d)
    run('bench --json at a FIFO is refused and kept', bench,
        ['--model', 'lenet', '--batch-size', '8', '--steps', '1', '--warmup', '0', '--json',
         'fifo'], 1, ['fifo', 'is a FIFO'], d)
    run('dump -o writes its file whole', dump, ['--model', 'lenet', '-o', 'lenet.txt'], 0,
        folder=d, may_change=['lenet.txt'])


if __name__ == '__main__':
    main()
