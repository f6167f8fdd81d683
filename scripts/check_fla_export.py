"""Checks folders written by `linearize export --format fla --reference-logits N` against
flash-linear-attention itself: each folder is loaded with transformers' AutoModelForCausalLM after
`import fla` (fla's model classes register there), run on the folder's reference input_ids, and its
logits compared with ours (reference_logits.safetensors, fp32 on the CPU).

    python3 scripts/check_fla_export.py [--fla-path SRC] [--dtype bfloat16] [--json OUT] DIR...

Prints one line per folder and dtype: fla's model_type, the largest absolute logit difference, the
relative error ||fla - ours|| / ||ours||, and whether the greedy next tokens agree; exits 1 when a
relative error exceeds its tolerance (bf16 3e-2; fp32 2e-3, where fla runs in fp32 at all: its chunked
delta-rule kernels refuse it). The first call of each of fla's Triton kernels compiles and autotunes it,
so allow a few minutes.
Needs torch, transformers, safetensors, triton and a CUDA device (fla's kernels are Triton). Where
flash-attn is missing, the softmax layers of hybrids run on a stand-in over PyTorch's SDPA (same causal
window), which checks the exported layout but not flash-attn itself.
"""
import argparse
import json
import os
import sys
import traceback

TOLERANCE = {"bfloat16": 3e-2, "float32": 2e-3}


def sdpa_flash_attn_func(q, k, v, causal=True, window_size=(-1, -1), softmax_scale=None, **_):
    """A stand-in for flash-attn's flash_attn_func on PyTorch's SDPA, for a machine without flash-attn:
    q [B, T, H, D], k and v [B, S, Hkv, D] (H a multiple of Hkv), causal aligned to the last key as
    flash-attn does, window (left, 0) letting a query see itself and `left` keys before it."""
    import torch
    import torch.nn.functional as F
    T, S, groups = q.shape[1], k.shape[1], q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
    i = torch.arange(T, device=q.device)[:, None] + (S - T)
    j = torch.arange(S, device=q.device)[None, :]
    allowed = j <= i if causal else torch.ones(T, S, dtype=torch.bool, device=q.device)
    if window_size[0] >= 0:
        allowed = allowed & (j >= i - window_size[0])
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=allowed, scale=softmax_scale)
    return o.transpose(1, 2)


def tie_keys_as_transformers5_reads_them(fla_models):
    """fla 0.5.2 declares `_tied_weights_keys = ["lm_head.weight"]`; transformers 5 reads a mapping from the
    tied name to its source and fails on a list ('list' object has no attribute 'keys'). fla's lm_head is
    tied to model.embeddings."""
    for name in dir(fla_models):
        cls = getattr(fla_models, name)
        if isinstance(cls, type) and isinstance(getattr(cls, "_tied_weights_keys", None), list):
            cls._tied_weights_keys = {k: "model.embeddings.weight" for k in cls._tied_weights_keys}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", help="exported folders")
    ap.add_argument("--fla-path", default="", help="folder holding fla's source package (fla/), put on sys.path")
    ap.add_argument("--dtype", default="bfloat16", help="comma-separated dtypes to run fla in (bfloat16, float32)")
    ap.add_argument("--json", default="", help="also write the figures as JSON to this file")
    args = ap.parse_args()
    if args.fla_path:
        sys.path.insert(0, args.fla_path)

    import torch
    import transformers
    from safetensors.torch import load_file
    import fla
    import fla.models  # registers fla's models with transformers' Auto classes, loudly if it cannot

    if int(transformers.__version__.split(".")[0]) >= 5:
        tie_keys_as_transformers5_reads_them(fla.models)
    import fla.layers.attn
    if fla.layers.attn.flash_attn_func is None:  # hybrids' softmax layers need it; say what stands in
        print("flash-attn is not installed: hybrids' softmax layers run on a stand-in over PyTorch's SDPA", flush=True)
        fla.layers.attn.flash_attn_func = sdpa_flash_attn_func

    torch.backends.cuda.matmul.allow_tf32 = False
    results, failed = [], False
    for d in args.dirs:
        ref = load_file(os.path.join(d, "reference_logits.safetensors"))
        ids, ours = ref["input_ids"].cuda(), ref["logits"].double()
        model_type = json.load(open(os.path.join(d, "config.json")))["model_type"]
        for name in args.dtype.split(","):
            dtype = getattr(torch, name)
            row = {"folder": d, "model_type": model_type, "dtype": name}
            try:
                model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=dtype).cuda().eval()
                with torch.no_grad():
                    theirs = model(input_ids=ids).logits.double().cpu()
                diff = theirs - ours
                row.update(max_abs=diff.abs().max().item(), rel=(diff.norm() / ours.norm()).item(),
                           argmax_agree=(theirs.argmax(-1) == ours.argmax(-1)).double().mean().item(),
                           fla_version=fla.__version__, transformers=transformers.__version__)
                row["ok"] = row["rel"] <= TOLERANCE.get(name, 3e-2)
            except Exception as e:  # a folder fla cannot load is a failure to report, not a crash
                row.update(ok=False, error=f"{type(e).__name__}: {e}")
                traceback.print_exc(limit=-4)
            failed |= not row["ok"]
            results.append(row)
            if args.json:  # after every row: a run cut short still leaves what it measured
                with open(args.json, "w") as f:
                    json.dump(results, f, indent=1)
            if "error" in row:
                print(f"{d}  {model_type:16s} {name:9s}  FAILED  {row['error']}", flush=True)
            else:
                print(f"{d}  {model_type:16s} {name:9s}  max|diff| {row['max_abs']:.3e}  rel {row['rel']:.3e}  "
                      f"argmax agree {100 * row['argmax_agree']:.1f}%  {'ok' if row['ok'] else 'OVER TOLERANCE'}",
                      flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
