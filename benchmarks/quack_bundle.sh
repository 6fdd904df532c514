#!/usr/bin/env bash
# Builds .quack/ (git-ignored, never committed), the QuACK source that bench_quack.py imports on the
# GPU machine, from a git clone of Dao-AILab/quack:  bash benchmarks/quack_bundle.sh /path/to/quack.git
# It holds QuACK's pure-Python `quack/` package and LICENSE at QUACK_COMMIT (the last commit that needs
# no apache-tvm-ffi; see bench_quack.py) as one tar.xz, and env.sh, which unpacks it into /tmp and puts
# it on PYTHONPATH: `source .quack/env.sh && python -m benchmarks.bench_quack ...` (with the CuTe DSL
# installed: pip install 'swiglu-fused[cuda]'). Only needed where the QuACK checkout cannot be on
# PYTHONPATH directly (a machine that receives the working tree alone); see bench_quack.py.
set -euo pipefail
QUACK_COMMIT=c7cbc61adeb19845721dfa72883f225f1e291ec2
src=${1:?usage: quack_bundle.sh QUACK_GIT_DIR}
cd "$(dirname "$0")/.."
mkdir -p .quack
git --git-dir="$src" archive --format=tar "$QUACK_COMMIT" quack LICENSE | xz -9 > .quack/quack.tar.xz
cat > .quack/env.sh <<ENV
# Source from the project root (benchmarks/quack_bundle.sh); puts QuACK's sources on PYTHONPATH.
export QUACK_COMMIT=$QUACK_COMMIT
_Q=/tmp/quack/\$QUACK_COMMIT
if [ ! -f "\$_Q/.complete" ]; then
  mkdir -p "\$_Q" && tar xJf .quack/quack.tar.xz -C "\$_Q" && touch "\$_Q/.complete" \\
  || { echo "quack-env: unpacking .quack/quack.tar.xz failed" >&2; return 1; }
fi
export PYTHONPATH="\$_Q\${PYTHONPATH:+:\$PYTHONPATH}"
ENV
echo "wrote .quack/ ($(du -b .quack/quack.tar.xz | cut -f1) bytes of source)"
