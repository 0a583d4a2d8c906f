#!/bin/bash
# Here (where `make setup` ran): what run.sh needs on a lent GPU machine, in .gpu/ (ignored;
# name it in the device tool's `carry`): the vendored llama.cpp sources (CUDA and CPU
# backends only), zero-weight model headers, llama-cpp-python's Python files, diskcache.
set -eu
cd "$(dirname "$0")/../.."
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/py/llama_cpp
src=$HOME/.cache/edgespec/llama.cpp/src-0.3.36
drop=""; for b in et metal hexagon sycl vulkan opencl cann webgpu openvino zdnn virtgpu; do
  drop="$drop --exclude=ggml/src/ggml-$b"; done
tar -cJf .gpu/src.tar.xz -C "$src/vendor/llama.cpp" $drop CMakeLists.txt cmake ggml src include vendor licenses LICENSE
heads=$(mktemp -d); .venv/bin/python tools/gpu/zero_weights.py "$heads"
tar -cf - -C "$heads" . | xz -9 > .gpu/z.tar.xz; rm -rf "$heads"
site=$(.venv/bin/python -c "import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))")
cp "$site"/*.py "$site"/py.typed .gpu/py/llama_cpp/
.venv/bin/python -m pip download -q --no-deps -d .gpu diskcache==5.6.3
cp tools/gpu/run.sh tools/gpu/*.py .gpu/
du -sh .gpu
