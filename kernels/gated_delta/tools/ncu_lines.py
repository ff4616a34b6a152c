"""Warp-stall samples of one kernel by source line (issue #6's profiling loop).

Nsight Compute samples every warp's program counter and stall reason. Its CLI prints them per
SASS instruction (`ncu -i REP --page source --csv --print-source sass`), but it cannot attribute
them to source lines through inlined functions: the kernels here are one `__global__` function
with everything inlined into it, so a per-function or per-instruction view says little. This tool
joins the per-instruction samples with the line table of the same binary (`nvdisasm -gi`, built
with `-lineinfo`, as kernels/gated_delta's CMakeLists does) and sums the samples per line of one
source file: for each instruction, the innermost line of that file in its inline chain (so a
helper called from a lambda counts at the lambda's line in the kernel's file, not at the helper).

  # on the GPU machine (run_device.sh step `lines`):
  ncu --set full --import-source yes --kernel-name regex:bwd_chunk --launch-count 1 -o rep bench 1
  ncu -i rep.ncu-rep --page source --csv --print-source sass > sass.csv
  # anywhere with nvdisasm (the CUDA toolkit, or the triton wheel in .venv):
  .venv/bin/python kernels/gated_delta/tools/ncu_lines.py sass.csv build/bench --kernel bwd_chunk \\
      --file gdn_bwd.cu --top 40
  .venv/bin/python kernels/gated_delta/tools/ncu_lines.py selftest   # a CPU ctest (needs nvcc)

Written by hand: Nsight's own Python report interface needs the Nsight libraries (not on the
development machine, and not in any wheel); what is needed here is a join of two text outputs.
"""
import collections
import csv
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FILE_RE = re.compile(r'"([^"]+)", line (\d+)')
INSN_RE = re.compile(r'^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*$')


def find_tool(name):
    """nvdisasm / cuobjdump: $NVDISASM-style override, PATH, CUDA_HOME, then the triton wheel."""
    env = os.environ.get(name.upper())
    if env:
        return env
    found = shutil.which(name)
    if found:
        return found
    for root in (os.environ.get('CUDA_HOME', ''), '/usr/local/cuda'):
        path = os.path.join(root, 'bin', name)
        if root and os.access(path, os.X_OK):
            return path
    repo = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
    for path in glob.glob(os.path.join(repo, '.venv/lib/python3*/site-packages/triton/backends/nvidia/bin', name)):
        return path
    sys.exit(f'ncu_lines: {name} not found (PATH, CUDA_HOME/bin, .venv triton wheel); set ${name.upper()}')


def cubins_of(binary, tmp):
    """The cubins of a host binary or shared library (cuobjdump -xelf), or the cubin itself."""
    with open(binary, 'rb') as f:
        head = f.read(64)
    # a cubin is an ELF whose e_machine is 190 (EM_CUDA) at offset 18
    if head[:4] == b'\x7fELF' and int.from_bytes(head[18:20], 'little') == 190:
        return [binary]
    subprocess.run([find_tool('cuobjdump'), '-xelf', 'all', os.path.abspath(binary)], cwd=tmp, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return sorted(glob.glob(os.path.join(tmp, '*.cubin')))


def line_table(binary, kernel):
    """{offset: (chain, sass text)} for the kernel whose (mangled) name contains `kernel`.
    chain: [(file, line), ...] innermost first."""
    with tempfile.TemporaryDirectory() as tmp:
        matches = []
        for cubin in cubins_of(binary, tmp):
            text = subprocess.run([find_tool('nvdisasm'), '-gi', '-c', cubin], check=True, capture_output=True,
                                  text=True).stdout
            names = [l[:-1] for l in text.split('\n') if l.endswith(':') and not l.startswith(('.', '\t', ' '))
                     and kernel in l]
            matches += [(n, text) for n in names]
    if len(matches) != 1:
        sys.exit(f'ncu_lines: {len(matches)} kernels match "{kernel}" in {binary}: '
                 f'{[n for n, _ in matches][:6]}')
    name, text = matches[0]
    lines = text.split('\n')
    start = lines.index(name + ':') + 1
    table, chain, in_block = {}, [], False
    for l in lines[start:]:
        if l.startswith('\t//## File'):
            if not in_block:  # a block of comment lines describes the next instruction's chain
                chain, in_block = [], True
            chain += [(f, int(n)) for f, n in FILE_RE.findall(l)]
            continue
        in_block = False
        m = INSN_RE.match(l)
        if m:
            table[int(m.group(1), 16)] = (chain, m.group(2))
        elif l.startswith('.text.') or l.startswith('//----'):
            if table:
                break  # the next function
    return name, table


def read_samples(path):
    """Rows of ncu's source page (sass): [(address, sass, {column: value})], in address order."""
    with open(path, newline='') as f:
        rows = list(csv.reader(f))
    hdr_at = next(i for i, r in enumerate(rows) if r and r[0] == 'Address')
    hdr = rows[hdr_at]
    out = []
    for r in rows[hdr_at + 1:]:
        if len(r) != len(hdr) or not r[0].startswith('0x'):
            continue
        vals = {}
        for h, v in zip(hdr[2:], r[2:]):
            try:
                vals[h] = float(v)
            except ValueError:
                pass
        out.append((int(r[0], 16), r[1], vals))
    if not out:
        sys.exit(f'ncu_lines: no instruction rows in {path}')
    return out


def norm_sass(s):
    """The predicate and mnemonic of a SASS line: ncu and nvdisasm print operands differently
    (register reuse flags, branch targets as addresses or labels)."""
    words = s.replace(';', ' ').split()
    return ' '.join(words[:2] if words and words[0].startswith('@') else words[:1])


def attribute(samples, table, file_suffix):
    """Per source line of the file: total samples and per stall reason. Also the share of
    instructions whose SASS text matched the disassembly (the offsets are taken from the first row)."""
    base = samples[0][0]
    total, by_line, reasons = 0.0, collections.Counter(), collections.defaultdict(collections.Counter)
    matched = checked = 0
    for addr, sass, vals in samples:
        s = vals.get('Warp Stall Sampling (All Samples)', 0.0)
        total += s
        chain, text = table.get(addr - base, ([], ''))
        checked += 1
        matched += norm_sass(text) == norm_sass(sass)
        line = next((n for f, n in chain if f.endswith(file_suffix)), -1)
        by_line[line] += s
        for k, v in vals.items():
            if k.startswith('stall_') and 'Not Issued' not in k and v:
                reasons[line][k[6:]] += v
    return total, by_line, reasons, matched / max(checked, 1)


def source_text(table, file_suffix, src_dir):
    paths = {f for chain, _ in table.values() for f, _ in chain if f.endswith(file_suffix)}
    for p in sorted(paths):
        for cand in ([os.path.join(src_dir, os.path.basename(p))] if src_dir else []) + [p]:
            if os.path.exists(cand):
                with open(cand) as f:
                    return f.read().split('\n')
    return []


def report(csv_path, binary, kernel, file_suffix, top, src_dir, out=sys.stdout):
    name, table = line_table(binary, kernel)
    samples = read_samples(csv_path)
    if not file_suffix:  # the kernel's own file: the outermost entry of the first chain
        file_suffix = os.path.basename(next(c for c, _ in table.values() if c)[-1][0])
    total, by_line, reasons, match = attribute(samples, table, file_suffix)
    src = source_text(table, file_suffix, src_dir)
    print(f'{name}: {len(samples)} instructions, {total:.0f} samples, by line of {file_suffix} '
          f'(SASS text matched the binary at {100 * match:.0f} % of the instructions)', file=out)
    if match < 0.95:
        print('  warning: the CSV and the binary disagree; was the profile taken from this build?', file=out)
    for line, s in by_line.most_common(top):
        why = ', '.join(f'{k} {100 * v / s:.0f}' for k, v in reasons[line].most_common(3)) if s else ''
        text = src[line - 1].strip()[:90] if 0 < line <= len(src) else ('(other files)' if line < 0 else '')
        print(f'{100 * s / max(total, 1):5.1f} %  {file_suffix}:{line:<5d} [{why}]  {text}', file=out)
    return by_line, total, match


SELFTEST_CU = r'''
__device__ __forceinline__ float helper(float x) {
  return x * x + 1.0f;                              // line 3: inlined into both call sites
}
__global__ void probe_kernel(const float* a, float* b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;    // line 6
  if (i < n) {
    float x = a[i];                                 // line 8
    b[i] = helper(x) * 3.0f;                        // line 9
  }
}
__global__ void other_kernel(float* b) { b[threadIdx.x] = 0.f; }
'''


def selftest():
    """Builds a two-kernel cubin with -lineinfo, writes an ncu-style CSV with samples on chosen
    instructions, and checks the per-line sums (innermost line of the file, offsets from the first
    row, the SASS match, the kernel chosen by name)."""
    nvcc = os.environ.get('NVCC') or shutil.which('nvcc') or '/usr/local/cuda/bin/nvcc'
    with tempfile.TemporaryDirectory() as tmp:
        cu, cubin = os.path.join(tmp, 'probe.cu'), os.path.join(tmp, 'probe.cubin')
        with open(cu, 'w') as f:
            f.write(SELFTEST_CU)
        subprocess.run([nvcc, '-cubin', '-lineinfo', '-O3', '-arch=sm_90', '-o', cubin, cu], check=True)
        name, table = line_table(cubin, 'probe_kernel')
        assert 'probe_kernel' in name and 'other' not in name, name
        # expected line of each instruction: innermost chain entry in probe.cu
        want = {off: next((n for f, n in chain if f.endswith('probe.cu')), -1) for off, (chain, _) in table.items()}
        # the load counts at line 8, the helper's arithmetic at its own line 3 (innermost in the file)
        assert {3, 8} <= set(want.values()), sorted(set(want.values()))
        base = 0x7f0000001000
        hdr = ['Address', 'Source', 'Warp Stall Sampling (All Samples)', 'Warp Stall Sampling (Not-issued Samples)',
               'stall_long_sb', 'stall_wait']
        rows = [['Kernel Name', name], hdr]
        expect = collections.Counter()
        for k, off in enumerate(sorted(table)):
            s = 10 * (k % 3) + 1
            expect[want[off]] += s
            rows.append([hex(base + off), table[off][1] + ' ;', str(s), '0', str(s), '0'])
        csv_path = os.path.join(tmp, 'sass.csv')
        with open(csv_path, 'w', newline='') as f:
            csv.writer(f).writerows(rows)
        import io
        buf = io.StringIO()
        by_line, total, match = report(csv_path, cubin, 'probe_kernel', 'probe.cu', 10, tmp, out=buf)
        assert match == 1.0, match
        assert total == sum(expect.values()), (total, expect)
        assert dict(by_line) == dict(expect), (by_line, expect)
        assert 'long_sb 100' in buf.getvalue(), buf.getvalue()
        # a CSV from another build (the SASS text shifted by one instruction) is flagged
        n = len(rows) - 2
        shifted = rows[:2] + [[r[0], rows[2 + (i + 1) % n][1]] + r[2:] for i, r in enumerate(rows[2:])]
        with open(csv_path, 'w', newline='') as f:
            csv.writer(f).writerows(shifted)
        buf = io.StringIO()
        report(csv_path, cubin, 'probe_kernel', 'probe.cu', 10, tmp, out=buf)
        assert 'warning: the CSV and the binary disagree' in buf.getvalue(), buf.getvalue()
    print(f'ncu_lines selftest: ok ({len(table)} instructions of {name}, lines {sorted(set(want.values()))})')


def main(argv):
    if argv[:1] == ['selftest']:
        return selftest()
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('csv', help='ncu --page source --csv --print-source sass output')
    ap.add_argument('binary', help='the profiled executable, shared library or cubin (built with -lineinfo)')
    ap.add_argument('--kernel', required=True, help='a substring of the kernel\'s mangled name')
    ap.add_argument('--file', default='', help='attribute to lines of this file (default: the kernel\'s own)')
    ap.add_argument('--top', type=int, default=40)
    ap.add_argument('--src', default='', help='directory to read the source text from (default: the recorded path)')
    a = ap.parse_args(argv)
    report(a.csv, a.binary, a.kernel, a.file, a.top, a.src)


if __name__ == '__main__':
    main(sys.argv[1:])
