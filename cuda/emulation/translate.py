#!/usr/bin/env python3
"""Rewrites a CUDA source file of the module as C++ for the host emulation (cuda_runtime.h here).

Three rewrites, nothing else (the kernels' code is compiled as written):
  kernel<<<grid, block, shared, stream>>>(args)  ->  ::ktier_emu::Launch(grid, block, shared,
                                                     stream).run("kernel", kernel, args)
  extern __shared__ T name[];                    ->  T* const name = static_cast<T*>(
                                                     ::ktier_emu::dynamic_shared());
  __shared__ T a[N], b[M];                       ->  static thread_local T a[N], b[M];
                                                     ::ktier_emu::shared_array(a, sizeof(a)); ...
                                                     (poisoned per block, counted in the limit)
Usage: translate.py IN.cu OUT.cpp
"""
import re
import sys

LAUNCH = re.compile(r'([A-Za-z_]\w*(?:<[^<>;(){}]*>)?)\s*<<<(.*?)>>>\s*\(', re.S)
DYNAMIC_SHARED = re.compile(r'extern\s+__shared__\s+([\w:]+)\s+(\w+)\s*\[\s*\]\s*;')
STATIC_SHARED = re.compile(r'^(\s*)__shared__\s+([^;\n]*);', re.M)  # declarations, not comments


def translate(text):
    def launch(m):
        kernel, config = m.group(1), m.group(2)
        return '::ktier_emu::Launch(%s).run("%s", %s, ' % (config, kernel, kernel)

    out, n = LAUNCH.subn(launch, text)
    out = DYNAMIC_SHARED.sub(
        r'\1* const \2 = static_cast<\1*>(::ktier_emu::dynamic_shared());', out)

    def static_shared(m):
        names = re.findall(r'(\w+)\s*\[', m.group(2))
        if not names:
            raise SystemExit('translate.py: a __shared__ variable that is not an array: '
                             + m.group(0))
        register = ' '.join('::ktier_emu::shared_array(%s, sizeof(%s));' % (n, n)
                            for n in names)
        return '%sstatic thread_local %s; %s' % (m.group(1), m.group(2), register)

    out = STATIC_SHARED.sub(static_shared, out)
    if re.search(r'^\s*[^/\s].*\b__shared__\b', out, re.M):
        raise SystemExit('translate.py: a __shared__ declaration was not recognised')
    if '<<<' in out:
        raise SystemExit('translate.py: a kernel launch was not recognised')
    return out, n


def main():
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding='utf-8') as f:
        text = f.read()
    out, _ = translate(text)
    with open(dst, 'w', encoding='utf-8') as f:
        f.write('#line 1 "%s"\n' % src)
        f.write(out)


if __name__ == '__main__':
    main()
