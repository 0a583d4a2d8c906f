"""GGUF headers for zero-weight models: what a lent GPU machine, which reaches no registry
and takes at most 64 MiB from here, needs to time the default pair and a 7B target.

A header is a model's key/values and tensor infos without the tensor data; on the GPU
machine ``truncate -s SIZE`` extends it with zeros (a sparse file). No kernel reads the
values, so a pass costs what it costs with the real weights, and every logit is zero: the
greedy answer repeats token 0 and every drafted token is accepted.

    python tools/gpu/zero_weights.py OUT_DIR   # OUT_DIR/*.head and sizes.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from edgespec.host import home

sys.path.insert(0, str(home() / "llama.cpp" / "src-0.3.36" / "vendor" / "llama.cpp" / "gguf-py"))
import gguf  # llama.cpp's own GGUF reader and writer, from the vendored sources

PAIR = ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"]
# Qwen2.5-Coder-7B's shape, with the pair's tokenizer (so the 0.5B model drafts for it).
WIDER = {1536: 3584, 8960: 18944, 256: 512}
SEVEN_B = {
    "qwen2.embedding_length": 3584,
    "qwen2.feed_forward_length": 18944,
    "qwen2.attention.head_count": 28,
    "qwen2.attention.head_count_kv": 4,
    "general.size_label": "7B",
    "general.name": "Qwen2.5-Coder-7B-shaped, zero weights",
}


def copy_header(model: Path, out: Path) -> int:
    out.write_bytes(model.read_bytes()[: gguf.GGUFReader(model).data_offset])
    return model.stat().st_size


def seven_b_header(model: Path, out: Path) -> int:
    reader = gguf.GGUFReader(model)
    writer = gguf.GGUFWriter(out, "qwen2")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, SEVEN_B.get(key, field.contents()), vtype, sub_type=sub)
    data = 0
    for tensor in reader.tensors:
        shape = [WIDER.get(int(d), int(d)) for d in tensor.shape]
        block, size = gguf.GGML_QUANT_SIZES[tensor.tensor_type]
        nbytes = int(np.prod(shape)) // block * size
        # gguf-py takes the shape in numpy's order, the reverse of the file's
        writer.add_tensor_info(tensor.name, shape[::-1], np.dtype(np.float32), nbytes, tensor.tensor_type)
        data += gguf.GGUFWriter.ggml_pad(nbytes, writer.data_alignment)
    writer.write_header_to_file(out)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    head = out.stat().st_size
    start = gguf.GGUFWriter.ggml_pad(head, writer.data_alignment)
    with open(out, "ab") as fh:
        fh.write(b"\0" * (start - head))
    return start + data


def main(out: Path) -> None:
    models = home() / "models"
    out.mkdir(parents=True, exist_ok=True)
    sizes = {name: copy_header(models / f"{name}.gguf", out / f"{name}.head") for name in PAIR}
    sizes["qwen7b-shaped"] = seven_b_header(models / f"{PAIR[0]}.gguf", out / "qwen7b-shaped.head")
    (out / "sizes.json").write_text(json.dumps(sizes))
    print(sizes)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
