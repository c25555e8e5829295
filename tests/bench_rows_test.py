#!/usr/bin/env python3
"""bench's rows and JSON keys for a classifier, the language model and a GAN are those of the
build before bench dispatched on the task through the registry (tests/fixtures/bench_rows.json,
recorded from that build): the same row names in the same order, each with the same keys, and
the table on stdout naming the same rows.

    python3 tests/bench_rows_test.py build/tools/bench
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(message):
    print('FAIL: ' + message, file=sys.stderr)
    sys.exit(1)


def main():
    bench = sys.argv[1]
    with open(os.path.join(HERE, 'fixtures', 'bench_rows.json')) as f:
        fixture = json.load(f)
    with tempfile.TemporaryDirectory(prefix='kiln_bench_rows.') as tmp:
        for model, rows in fixture['models'].items():
            path = os.path.join(tmp, model + '.json')
            run = subprocess.run([bench, '--model', model, '--steps', '2', '--warmup', '1',
                                  '--batch-size', '8', '16', '--unfused', '--check-numerics',
                                  '--json', path], capture_output=True, text=True, timeout=600)
            if run.returncode != 0:
                fail(f'{model}: exit code {run.returncode}\n{run.stderr}')
            with open(path) as f:
                got = json.load(f)
            names = [r['name'] for r in got]
            if names != [r['name'] for r in rows]:
                fail(f'{model}: rows {names}, expected {[r["name"] for r in rows]}')
            for r, expected in zip(got, rows):
                if sorted(r) != expected['keys']:
                    fail(f'{model}: row {r["name"]!r} has keys {sorted(r)}, expected '
                         f'{expected["keys"]}')
            table = [line for line in run.stdout.splitlines()[1:] if line.strip()]
            if len(table) != len(names) or not all(
                    line.startswith(name + ' ') for line, name in zip(table, names)):
                fail(f'{model}: the table rows differ from the JSON:\n{run.stdout}')
            print(f'ok [{model}: {len(rows)} rows, same names and keys]')


if __name__ == '__main__':
    main()
