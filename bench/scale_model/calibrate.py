#!/usr/bin/env python3
"""scale_model's predictions beside bench_ddp's measured DDP steps (plain Python 3, no packages).

For every DDP row of a bench_ddp output (ddp_step: a bucket size; ddp_comm_hook: a hook at the
default buckets; ddp_zero: ZeRO stage 1 or 2; ddp_gan: the DCGAN step, no hook or bf16), runs scale_model on the same model, batch, world
size and options, with the step time without communication measured in the same run (the
ddp_step, ddp_gan and ddp_comm_hook row's local step, timed interleaved with it; for ZeRO, and
hook rows of older outputs, the default-bucket row's, measured minutes apart) as the compute to
scale to, the ranks' skew (--skew measured, the default: the median of each step's slowest rank minus
the slowest rank's median, where the row has both: what a DDP step waits for and a step alone does
not), and bench_ddp's first bucket cap (min(cap, 1 MB)),
and prints predicted against measured: the step and what DDP added to it.

Usage: calibrate.py --tool build/bench/scale_model --fabric mpi-shm BENCH_DDP_OUTPUT...
"""
import argparse
import json
import re
import subprocess
import sys


def rows(path):
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith('{"op":"ddp_'):
                yield json.loads(line)


def predict(tool, fabric, model, batch, ranks, cap, hook, zero, step_ms, memory_gbs, hook_cost, skew_ms):
    cmd = [tool, '--model', model, '--batch', str(batch), '--gpus', str(ranks), '--fabric', fabric,
           '--bucket-cap-mb', str(cap), '--first-bucket-cap-mb', str(min(cap, 1.0)), '--hook', hook, '--zero', str(zero), '--step-ms', str(step_ms),
           '--memory-gbs', str(memory_gbs), '--hook-cost', hook_cost]
    if skew_ms > 0:  # the tool takes positive values only
        cmd += ['--skew-ms', str(skew_ms)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith('{"op":"scale_model"'):
            r = json.loads(line)
            if r['gpus'] == ranks:
                return r
    raise RuntimeError('no prediction in: ' + out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--tool', required=True)
    ap.add_argument('--fabric', required=True)
    ap.add_argument('--memory-gbs', type=float, default=10.0, help="the CPU's memory bandwidth for the default path's divide")
    ap.add_argument('--hook-cost', default='measured', choices=['measured', 'memory'],
                    help="the hooks' compute: timed on this CPU (default) or memory traffic over --memory-gbs")
    ap.add_argument('--skew', default='measured', choices=['measured', 'none'],
                    help="the ranks' skew (scale_model --skew-ms): baseline_slowest_ms - baseline_ms where the row "
                         "has both, or none")
    ap.add_argument('outputs', nargs='+')
    args = ap.parse_args()
    print('| ranks | model | options | local ms | skew ms | measured ms | predicted ms | error | measured added | predicted added |')
    print('|---:|---|---|---:|---:|---:|---:|---:|---:|---:|')
    for path in args.outputs:
        local = {}
        for r in rows(path):
            m = re.match(r'(mae_\w+|dcgan28) b(\d+) x(\d+) ranks, (.*)', r['shape'])
            if not m:
                continue
            config, batch, ranks, rest = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
            model = config.replace('_', '-')
            cap, hook, zero = 25, 'none', 0
            if r['op'] == 'ddp_gan':
                hook = rest.split()[-1]
                base = r['baseline_ms']
            elif r['op'] == 'ddp_step':
                cap = float(re.match(r'bucket ([\d.]+)MB', rest).group(1))
                base = r['baseline_ms']
                if cap == 25:
                    local[config] = base
            elif r['op'] == 'ddp_comm_hook':
                hook = rest.split()[-1]
                hook = 'powersgd:4' if hook == 'powersgd' else hook
                base = r.get('baseline_ms', local.get(config))
            elif r['op'] == 'ddp_zero':
                if rest.startswith('AdamW'):
                    continue
                zero = 1 if 'ZeRO-1' in rest else 2
                base = local.get(config)
            else:
                continue
            if base is None:
                continue
            skew = 0.0
            if args.skew == 'measured' and 'baseline_slowest_ms' in r:
                skew = max(0.0, r['baseline_slowest_ms'] - base)
            p = predict(args.tool, args.fabric, model, batch, ranks, cap, hook, zero, base, args.memory_gbs, args.hook_cost,
                        skew)
            options = 'bucket %gMB' % cap if r['op'] == 'ddp_step' else (hook if zero == 0 else 'zero %d' % zero)
            if r['op'] == 'ddp_zero' or (r['op'] == 'ddp_comm_hook' and 'baseline_ms' not in r):
                options += ' (local: the 25MB row)'
            err = p['ms'] / r['ms'] - 1
            print('| %d | %s | %s | %.2f | %.2f | %.2f | %.2f | %+.0f%% | %.2f | %.2f |' % (
                ranks, model, options, base, skew, r['ms'], p['ms'], 100 * err, r['ms'] - base, p['ms'] - base))
    return 0


if __name__ == '__main__':
    sys.exit(main())
