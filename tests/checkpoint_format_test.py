#!/usr/bin/env python3
"""A checkpoint written by `trainer` is a valid safetensors file.

Parses it with the standard library only (json, struct), from the format description and
independently of kiln's loader: the 8-byte header length, the JSON header, dtypes, shapes,
data offsets (contiguous, in range, aligned) and the data size. Then checks the contents
against what the same run wrote in its --metrics file: the optimizer's step count and
learning rate, the training config in __metadata__. Runs in bf16 and fp16 write the same
layout: F32 master weights and optimizer state (never the bf16/f16 weight copies the step
keeps), the precision in kiln.config, and for fp16 the loss scale and its count of skipped
steps.

    python3 tests/checkpoint_format_test.py build/tools/trainer
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

DTYPES = {'F64': ('d', 8), 'F32': ('f', 4), 'F16': ('e', 2), 'BF16': ('H', 2), 'I64': ('q', 8), 'I32': ('i', 4),
          'U8': ('B', 1)}
STEPS, BATCH, SEED, LR = 60, 32, 7, 0.004


def fail(message):
    print('FAIL: ' + message, file=sys.stderr)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    check(len(keys) == len(set(keys)), 'duplicate keys in the header: %s' % keys)
    return dict(pairs)


def parse_safetensors(raw):
    """Returns (metadata, {name: (dtype, shape, values)}), checking every rule of the format."""
    check(len(raw) >= 8, 'shorter than the 8-byte header length')
    (n,) = struct.unpack('<Q', raw[:8])
    check(8 + n <= len(raw), 'header length %d runs past the file (%d bytes)' % (n, len(raw)))
    check(n % 8 == 0, 'header length %d is not padded to a multiple of 8' % n)
    text = raw[8:8 + n].decode('utf-8')
    check(text.startswith('{'), 'the header must be a JSON object')
    header = json.loads(text, object_pairs_hook=no_duplicates)
    metadata = header.pop('__metadata__', {})
    check(all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()), '__metadata__ must map strings to strings')
    data = raw[8 + n:]
    tensors, end = {}, 0
    for name, info in sorted(header.items(), key=lambda kv: kv[1]['data_offsets']):
        check(set(info) == {'dtype', 'shape', 'data_offsets'}, '%s: keys %s' % (name, sorted(info)))
        check(info['dtype'] in DTYPES, '%s: unknown dtype %s' % (name, info['dtype']))
        code, size = DTYPES[info['dtype']]
        shape = info['shape']
        check(isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape), '%s: bad shape %s' % (name, shape))
        begin, stop = info['data_offsets']
        check(begin == end, '%s: starts at %d, not at %d where the previous tensor ended (gap or overlap)' % (name, begin, end))
        count = math.prod(shape)
        check(stop - begin == count * size, '%s: %d bytes for %s %s' % (name, stop - begin, info['dtype'], shape))
        check(stop <= len(data), '%s: ends at %d, past the %d bytes of data' % (name, stop, len(data)))
        check(begin % size == 0, '%s: offset %d is not aligned to its element size %d' % (name, begin, size))
        tensors[name] = (info['dtype'], shape, struct.unpack('<%d%s' % (count, code), data[begin:stop]))
        end = stop
    check(end == len(data), 'the tensors cover %d bytes but the data has %d' % (end, len(data)))
    return metadata, tensors


def main():
    if len(sys.argv) != 2:
        fail('usage: checkpoint_format_test.py TRAINER')
    trainer = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix='kiln_checkpoint_format.') as tmp:
        path, metrics = os.path.join(tmp, 'c.safetensors'), os.path.join(tmp, 'm.jsonl')
        command = [trainer, '--synthetic', '--epochs', '1', '--max-steps', str(STEPS), '--batch-size', str(BATCH),
                   '--seed', str(SEED), '--optimizer', 'adam', '--lr', str(LR), '--lr-schedule', 'step', '--lr-step-size', '20',
                   '--lr-gamma', '0.5', '--clip-grad-norm', '5', '--threads', '1', '--no-progress',
                   '--checkpoint', path, '--metrics', metrics]
        run = subprocess.run(command, capture_output=True, text=True, timeout=600)
        check(run.returncode == 0, 'trainer failed (%d): %s' % (run.returncode, run.stderr))
        raw = open(path, 'rb').read()
        lines = [json.loads(line) for line in open(metrics)]
    metadata, tensors = parse_safetensors(raw)
    print('parsed %d tensors, %d bytes, metadata keys %s' % (len(tensors), len(raw), sorted(metadata)))

    # The layout kiln promises: parameters, and Adam's m and v for each, its step and lr.
    params = sorted(name[len('param/'):] for name in tensors if name.startswith('param/'))
    check(params, 'no parameters')
    for p in params:
        dtype, shape, values = tensors['param/' + p]
        check(dtype == 'F32' and all(math.isfinite(v) for v in values), 'param/%s is not finite F32' % p)
        for moment in ('m', 'v'):
            other = tensors.get('state/optimizer.%s.%s' % (p, moment))
            check(other is not None and other[:2] == (dtype, shape), 'state/optimizer.%s.%s missing or of another shape' % (p, moment))
    check(all(v >= 0 for p in params for v in tensors['state/optimizer.%s.v' % p][2]), "Adam's v must be >= 0")

    # Metadata: the position, the data seed, every config key.
    check(metadata['kiln.step'] == str(STEPS) and metadata['kiln.epoch'] == '1' and metadata['kiln.batch'] == str(STEPS),
          'position %s' % {k: metadata[k] for k in ('kiln.step', 'kiln.epoch', 'kiln.batch')})
    check(metadata['kiln.data_seed'] == str(SEED), 'kiln.data_seed is %s' % metadata['kiln.data_seed'])
    check(metadata['model'] == 'lenet', 'model is %s' % metadata['model'])
    config = json.loads(metadata['kiln.config'])
    expected = {'model': 'lenet', 'batch-size': BATCH, 'max-steps': STEPS, 'seed': SEED, 'optimizer': 'adam', 'lr': LR,
                'lr-schedule': 'step', 'lr-step-size': 20, 'lr-gamma': 0.5, 'clip-grad-norm': 5, 'synthetic': True,
                'epochs': 1, 'save-every': None, 'checkpoint': path, 'metrics': metrics}
    for key, value in expected.items():
        check(config.get(key) == value, 'kiln.config has %s = %r, expected %r' % (key, config.get(key), value))
    check(len(config) >= 30, 'kiln.config has only %d keys' % len(config))

    # Values against the run's metrics: the optimizer's step count and its last learning rate.
    step_lines = [line for line in lines if line['kind'] == 'step']
    check([line['step'] for line in step_lines] == [50, STEPS], 'metrics step lines %s' % step_lines)
    (step_count,) = tensors['state/optimizer.step'][2]
    check(step_count == STEPS == step_lines[-1]['step'], 'state/optimizer.step is %s' % step_count)
    (lr,) = tensors['state/optimizer.lr'][2]
    check(abs(lr - step_lines[-1]['lr']) <= 1e-6 * step_lines[-1]['lr'], 'state/optimizer.lr %r, metrics %r' % (lr, step_lines[-1]['lr']))
    check(abs(lr - LR * 0.25) <= 1e-6 * LR, 'lr %r: the step schedule should be at %r after 59 steps' % (lr, LR * 0.25))
    print('ok: %d parameters, step %d, lr %g' % (len(params), step_count, lr))
    for precision in ('bf16', 'fp16'):
        check_low_precision(trainer, precision, params)


def check_low_precision(trainer, precision, fp32_params):
    with tempfile.TemporaryDirectory(prefix='kiln_checkpoint_format.') as tmp:
        path = os.path.join(tmp, 'c.safetensors')
        command = [trainer, '--synthetic', '--epochs', '1', '--max-steps', '4', '--batch-size', '16',
                   '--precision', precision, '--threads', '1', '--no-progress', '--checkpoint', path]
        run = subprocess.run(command, capture_output=True, text=True, timeout=600)
        check(run.returncode == 0, 'trainer --precision %s failed (%d): %s' % (precision, run.returncode, run.stderr))
        metadata, tensors = parse_safetensors(open(path, 'rb').read())
    params = sorted(name[len('param/'):] for name in tensors if name.startswith('param/'))
    check(params == fp32_params, '%s: parameters %s, not those of fp32 %s' % (precision, params, fp32_params))
    for name, (dtype, shape, values) in tensors.items():
        check('@' not in name, '%s: the weight copy %s is in the checkpoint' % (precision, name))
        if name.startswith('param/') or name.endswith('.m') or name.endswith('.v'):
            check(dtype == 'F32' and all(math.isfinite(v) for v in values), '%s: %s is not finite F32' % (precision, name))
    check(json.loads(metadata['kiln.config']).get('precision') == precision, '%s: kiln.config precision' % precision)
    skipped = tensors.get('state/optimizer.loss_scale.skipped_steps')
    if precision == 'fp16':
        check(skipped is not None and skipped[0] == 'F64' and 0 <= skipped[2][0] <= 4,
              'fp16: loss_scale.skipped_steps %s' % (skipped,))
        scale = [t for n, t in tensors.items() if 'loss_scale' in n and 'skipped' not in n]
        check(scale and all(v > 0 and math.isfinite(v) for t in scale for v in t[2]), 'fp16: the loss scale %s' % scale)
    else:
        check(skipped is None, 'bf16 keeps no loss scale')
    print('ok: %s checkpoint, %d F32 parameters' % (precision, len(params)))


if __name__ == '__main__':
    main()
