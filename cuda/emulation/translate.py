#!/usr/bin/env python3
"""Rewrites a CUDA source file of the module as C++ for the host emulation (cuda_runtime.h here).

Three rewrites, nothing else (the kernels' code is compiled as written):
  kernel<<<grid, block, shared, stream>>>(args)  ->  ::ktier_emu::Launch(grid, block, shared,
                                                     stream).run("kernel", kernel, args)
  extern __shared__ T name[];                    ->  T* const name = static_cast<T*>(
                                                     ::ktier_emu::dynamic_shared());
  __shared__                                     ->  static thread_local
Usage: translate.py IN.cu OUT.cpp
"""
import re
import sys

LAUNCH = re.compile(r'([A-Za-z_]\w*(?:<[^<>;(){}]*>)?)\s*<<<(.*?)>>>\s*\(', re.S)
DYNAMIC_SHARED = re.compile(r'extern\s+__shared__\s+([\w:]+)\s+(\w+)\s*\[\s*\]\s*;')


def translate(text):
    def launch(m):
        kernel, config = m.group(1), m.group(2)
        return '::ktier_emu::Launch(%s).run("%s", %s, ' % (config, kernel, kernel)

    out, n = LAUNCH.subn(launch, text)
    out = DYNAMIC_SHARED.sub(
        r'\1* const \2 = static_cast<\1*>(::ktier_emu::dynamic_shared());', out)
    out = re.sub(r'\b__shared__\b', 'static thread_local', out)
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
