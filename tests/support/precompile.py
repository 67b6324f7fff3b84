#!/usr/bin/env python3
"""Precompiles <distribute/distribute.hpp> for the test programs of a g++ build (a build step).

  precompile.py BUILDDIR REFERENCE_SOURCE OUTDIR STAMP DEPFILE

Takes REFERENCE_SOURCE's compile command from BUILDDIR/compile_commands.json, so the header is
compiled with exactly the flags of the test programs (sanitizers included), and writes
OUTDIR/distribute/distribute.hpp.gch. OUTDIR is on the include path of the tests built against
include/ (not of those against single_include/), before include/ itself, so
g++ uses the .gch for a test file that includes the umbrella header first with the same flags, and
reads the header itself everywhere else (other flags, other macros: -Winvalid-pch says so). Every
test file parses the umbrella header and instantiates what it instantiates: about a quarter of its
compile time, paid here once."""
import json
import os
import shlex
import subprocess
import sys

WITH_ARGUMENT = {"-o", "-MQ", "-MF", "-MT", "-c"}
ALONE = {"-MD", "-MMD"}


def main() -> int:
    builddir, reference, outdir, stamp, depfile = sys.argv[1:6]
    with open(os.path.join(builddir, "compile_commands.json"), encoding="utf-8") as f:
        entries = json.load(f)
    ref = next((e for e in entries if os.path.basename(e["file"]) == reference), None)
    if ref is None:
        print(f"precompile.py: no compile command for {reference} in {builddir}", file=sys.stderr)
        return 1
    words, flags, skip = shlex.split(ref["command"]), [], False
    for w in words:
        if skip:
            skip = False
        elif w in WITH_ARGUMENT:
            skip = True
        elif w not in ALONE and not w.endswith(os.path.basename(ref["file"])):
            flags.append(w)
    gch = os.path.abspath(os.path.join(outdir, "distribute", "distribute.hpp.gch"))
    # The library's header: the first on the include path that is not the forwarding one written below
    # (OUTDIR comes first there, and a rebuild would otherwise precompile the forwarder itself).
    header = next(os.path.join(ref["directory"], w[2:], "distribute", "distribute.hpp")
                  for w in flags if w.startswith("-I")
                  and os.path.realpath(os.path.join(ref["directory"], w[2:])) != os.path.realpath(outdir)
                  and os.path.exists(os.path.join(ref["directory"], w[2:], "distribute", "distribute.hpp")))
    os.makedirs(os.path.dirname(gch), exist_ok=True)
    tmp = gch + ".tmp"
    cmd = [*flags, "-x", "c++-header", header, "-o", tmp, "-MD", "-MF", os.path.abspath(depfile),
           "-MT", os.path.abspath(stamp)]
    r = subprocess.run(cmd, cwd=ref["directory"])
    if r.returncode != 0:
        return r.returncode
    os.replace(tmp, gch)
    # g++ that finds the .gch where it is not usable (a second include of the umbrella: its #pragma once is
    # then checked against this directory) reads the header of the .gch's own directory: this one forwards.
    with open(os.path.join(os.path.dirname(gch), "distribute.hpp"), "w", encoding="utf-8") as f:
        f.write(f'#include "{os.path.abspath(header)}"\n')
    with open(stamp, "w", encoding="utf-8") as f:
        f.write(gch + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
