"""Where the int4 verifier's top-1 agreement with fp32 goes: one change to the exact weights at a time.

    .venv/bin/python -m benchmarks.kernel_fidelity --tokens 64

The fp32 verifier (the GGUF's exact values) continues each held-out prompt greedily (cached in --reference); every
variant then reads prompt + continuation in one forward, and counts how often its top-1 equals fp32's at the same
position (teacher-forced top-1 agreement, as benchmarks/weights_passes.py). A variant is the fp32 model with one or
more of the int4 setting's departures from the GGUF, emulated in fp32 torch (the kernel's arithmetic differs only
in the order of its float sums):
    act        activations quantized to int8 per row and group of `act` values (max |v| / 127), as the kernel does
    q4k_bf16   the Q4_K tensors' per-32 scale and offset rounded to bf16 (the kernel's old tile layout)
    q6k_int8   the Q6_K layer tensors re-quantized to per-channel int8 (Int8Linear)
    act_only   ... only the inputs of the linears whose names hold one of these (where the loss is)
    head_int8  the output head's input quantized too (its logits are re-scored exactly in the shipped model, so
               this only shows what re-scoring saves)
and `kernel`: the int4 verifier as built (the project's kernel). One JSON line per variant.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.harness import parser, prompts as load, run_main

VARIANTS = {
    "exact": {},
    "act32": {"act": 32},
    "q4k_bf16": {"q4k_bf16": True},
    "q6k_int8": {"q6k_int8": True},
    "act32+q4k_bf16": {"act": 32, "q4k_bf16": True},
    "act32+q6k_int8": {"act": 32, "q6k_int8": True},
    "q4k_bf16+q6k_int8": {"q4k_bf16": True, "q6k_int8": True},
    "act32+q4k_bf16+q6k_int8 (old layout)": {"act": 32, "q4k_bf16": True, "q6k_int8": True},
    "act32+head": {"act": 32, "head_int8": True},
    "act32 q/k/v only": {"act": 32, "act_only": ["q_proj", "k_proj", "v_proj"]},
    "act32 o only": {"act": 32, "act_only": ["o_proj"]},
    "act32 gate/up only": {"act": 32, "act_only": ["gate_proj", "up_proj"]},
    "act32 down only": {"act": 32, "act_only": ["down_proj"]},
    "act16": {"act": 16},
    "act64": {"act": 64},
    "act256": {"act": 256},
}


def quantized_input(x: torch.Tensor, group: int) -> torch.Tensor:
    """x with every run of `group` values along the last dim replaced by its int8 quantization's values."""
    g = x.reshape(*x.shape[:-1], -1, group)
    amax = g.abs().amax(-1, keepdim=True)
    q = torch.where(amax > 0, g * (127 / amax), torch.zeros_like(g)).round().clamp(-127, 127)
    return (q * (amax / 127)).reshape(x.shape)


def variant_weight(entries, name: str, spec: dict, exact: torch.Tensor) -> torch.Tensor:
    """The weight `name` in the variant: `exact` (the GGUF's values) unless the variant changes its type."""
    kind = entries.type(name) if entries.is_codes(name) else None
    if kind == "Q4_K" and spec.get("q4k_bf16"):
        c = entries.codes(name)
        n, k = c.codes.shape
        scale, offset = (torch.from_numpy(v).bfloat16().float()[..., None] for v in (c.scale, c.offset))
        return (torch.from_numpy(c.codes).float().view(n, -1, c.group) * scale + offset).view(n, k)
    if kind == "Q6_K" and spec.get("q6k_int8") and "lm_head" not in name:
        s = exact.abs().amax(1).clamp(min=1e-12) / 127
        return (exact / s[:, None]).round().clamp_(-127, 127) * s[:, None]
    return exact


class Emulated(torch.nn.Module):
    def __init__(self, exact: torch.Tensor, weight: torch.Tensor, bias, act: int):
        super().__init__()
        self.exact, self.weight, self.bias, self.act = exact, weight, bias, act

    def forward(self, x):
        return F.linear(quantized_input(x, self.act) if self.act else x, self.weight, self.bias)


def apply(model, entries, spec: dict) -> None:
    """Sets every linear of `model` to the variant's weights and input quantization."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, (torch.nn.Linear, Emulated)):
                full = f"{name}.{child_name}" if name else child_name
                head = full == "lm_head"
                act = spec.get("act", 0) if (not head or spec.get("head_int8")) else 0
                if "act_only" in spec and not any(part in full for part in spec["act_only"]):
                    act = 0
                exact = child.exact if isinstance(child, Emulated) else child.weight
                w = variant_weight(entries, f"{full}.weight", spec, exact)
                setattr(module, child_name, Emulated(exact, w, child.bias, act))


@torch.inference_mode()
def top1(model, refs) -> list[list[int]]:
    return [model(torch.tensor([ids + cont])).logits[0, len(ids) - 1:-1].argmax(-1).tolist() for ids, cont in refs]


def agreement(mine, ref) -> tuple[int, int]:
    pairs = [(a, b) for m, r in zip(mine, ref) for a, b in zip(m, r)]
    return sum(a == b for a, b in pairs), len(pairs)


def measure(model, entries, refs, names: list[str], config=None) -> list[dict]:
    """Agreement of each variant (VARIANTS, or "kernel": the int4 model as built from `entries` with `config`) with
    `model`'s exact fp32 top-1 over `refs` [(prompt ids, continuation)]; `model` is changed in place."""
    from via_sd.weights.build import build_model

    reference, rows = top1(model, refs), []
    for name in names:
        t0 = time.perf_counter()
        if name == "kernel":
            model = build_model(config, entries, "int4")
            note = getattr(model, "via_sd_weights", "")
        else:
            apply(model, entries, VARIANTS[name])
            note = json.dumps(VARIANTS[name])
        same, total = agreement(top1(model, refs), reference)
        rows.append({"variant": name, "agreement": round(same / total, 4), "agreeing": same, "positions": total,
                     "spec": note, "s": round(time.perf_counter() - t0, 1)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="names of VARIANTS, and/or kernel")
    ap.add_argument("--reference", default="/tmp/via-sd-fidelity-reference.json", help="fp32 continuations cache")
    args = ap.parse_args(argv)
    from transformers import AutoConfig, AutoTokenizer

    from via_sd.weights.build import build_model
    from via_sd.weights.gguf_pack import Entries
    from via_sd.weights.paths import cache_root

    folder = cache_root() / "embedded" / "qwen2.5-coder-1.5b-instruct"  # the embedded verifier's GGUF
    config = AutoConfig.from_pretrained(folder)
    entries = Entries.from_folder(folder, config)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = [p["prompt"] for p in load(args)]
    model = build_model(config, entries, "fp32")
    ref_path = Path(args.reference)
    saved = json.loads(ref_path.read_text()) if ref_path.is_file() else {}
    if saved.get("prompts") == prompts and saved.get("tokens") == args.tokens:
        refs = saved["refs"]
    else:
        chats = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
                 for p in prompts]
        with torch.inference_mode():
            refs = [(ids, model.generate(torch.tensor([ids]), max_new_tokens=args.tokens, min_new_tokens=args.tokens,
                                         do_sample=False)[0, len(ids):].tolist())
                    for ids in (tokenizer(c, add_special_tokens=False).input_ids for c in chats)]
        ref_path.write_text(json.dumps({"prompts": prompts, "tokens": args.tokens, "refs": refs}))
    names = args.variants.split(",")
    if "kernel" in names:  # last: it frees the fp32 model
        names = [n for n in names if n != "kernel"] + ["kernel"]
    measure(model, entries, refs, names, config)
    return 0


if __name__ == "__main__":
    run_main(main)
