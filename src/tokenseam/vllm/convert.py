"""Convert a GGUF model to a Hugging Face folder vLLM can load (vLLM 0.32 reads no GGUF).

Runs inside the vLLM environment (it needs transformers, torch, gguf and accelerate, which
`tokenseam vllm setup` installs there): `python -m tokenseam.vllm.convert MODEL.gguf OUT_DIR`.
The weights are dequantized to float32, the tokenizer is rebuilt from the GGUF's own metadata and whatever
transformers drops on the way (Gemma's "add BOS", a chat template) is restored from that metadata. Nothing is
fetched from a hub.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DONE = "tokenseam-convert.json"  # written last: its presence means the folder is complete


def _gguf_metadata(path: Path) -> dict:
    """The few GGUF metadata fields the conversion may need to restore."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    out: dict = {}
    for key in ("tokenizer.ggml.add_bos_token", "tokenizer.chat_template", "general.name"):
        field = reader.fields.get(key)
        if field is None:
            continue
        value = field.parts[field.data[0]]
        if key == "tokenizer.ggml.add_bos_token":
            out[key] = bool(value[0])
        else:
            out[key] = bytes(value).decode("utf-8")
    return out


def convert(gguf_path: Path, out_dir: Path) -> dict:
    """Write the HF folder for `gguf_path` into `out_dir`; returns what was written (also saved as DONE)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = gguf_path.resolve()
    folder, name = str(gguf_path.parent), gguf_path.name
    meta = _gguf_metadata(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # The weights are dequantized already; transformers still refuses to save a model that came from GGUF
    # until the quantizer is cleared.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    restored = []
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    if add_bos is not None and getattr(tokenizer, "add_bos_token", None) != add_bos:
        tokenizer.add_bos_token = add_bos
        restored.append("add_bos_token")
    template = meta.get("tokenizer.chat_template")
    if template and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = template
        restored.append("chat_template")
    tokenizer.save_pretrained(out_dir)
    if add_bos is not None:
        _force_add_bos(out_dir, add_bos)
    info = {
        "source": str(gguf_path),
        "source_name": gguf_path.name,
        "source_bytes": gguf_path.stat().st_size,
        "name": meta.get("general.name", gguf_path.stem),
        "dtype": "float32",
        "restored": restored,
        "chat_template": bool(template),
    }
    (out_dir / DONE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


def _force_add_bos(out_dir: Path, add_bos: bool) -> None:
    """Write the GGUF's add-BOS flag into tokenizer_config.json (some transformers versions save it only in
    memory), so vLLM's tokenizer prepends BOS exactly when llama.cpp does."""
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    if cfg.get("add_bos_token") != add_bos:
        cfg["add_bos_token"] = add_bos
        cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tokenseam.vllm.convert", description=__doc__.splitlines()[0])
    ap.add_argument("gguf", type=Path, help="the .gguf file")
    ap.add_argument("out", type=Path, help="the folder to write (created)")
    args = ap.parse_args(argv)
    if not args.gguf.is_file():
        print(f"error: no GGUF file at {args.gguf}", file=sys.stderr)
        return 2
    info = convert(args.gguf, args.out)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
