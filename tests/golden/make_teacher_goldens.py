"""Golden references for the Llama family's other teachers (tests/golden/<name>/), in the layout of
../shared/golden/llama-gqa: tiny random Qwen2, Qwen3 and Mistral models run through Hugging Face
transformers in fp32 with eager attention. Needs torch, transformers and safetensors:

    python3 tests/golden/make_teacher_goldens.py tests/golden

Each folder: config.json and model.safetensors (save_pretrained), reference.safetensors with
input_ids [2,33], logits, token_nll [2,32], mean_nll, layer_in.i / layer_out.i (the residual stream
into / out of decoder layer i), attn_in.i / attn_out.i (self-attention's input after the layer norm,
its output after o_proj), final_norm_out, and generate.prompt [1,8] / generate.output [1,32] (greedy).
"""
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def config(kind):
    common = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                  max_position_embeddings=256, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    if kind == "qwen2":
        c = transformers.Qwen2Config(**common)  # biases on q, k, v
    elif kind == "qwen3":
        c = transformers.Qwen3Config(head_dim=32, attention_bias=False, **common)  # 4 x 32 = 128 > hidden 64
    elif kind == "mistral":
        c = transformers.MistralConfig(sliding_window=8, **common)  # the 33-token input crosses the window
    else:
        raise ValueError(kind)
    # RoPE base 1e5 in whichever layout this transformers uses.
    if getattr(c, "rope_parameters", None) is not None:
        c.rope_parameters = {"rope_type": "default", "rope_theta": 1e5}
    else:
        c.rope_theta = 1e5
    c._attn_implementation = "eager"
    return c


def perturbed(model):
    # Away from the initial values: norms near 1, biases and weights random.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    return model


def reference(model, ids):
    out = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.register_forward_pre_hook(
            lambda m, args, kwargs, i=i: out.__setitem__(f"layer_in.{i}", (args[0] if args else kwargs["hidden_states"]).detach().clone()),
            with_kwargs=True))
        hooks.append(layer.register_forward_hook(
            lambda m, args, res, i=i: out.__setitem__(f"layer_out.{i}", (res[0] if isinstance(res, tuple) else res).detach().clone())))
        hooks.append(layer.self_attn.register_forward_pre_hook(
            lambda m, args, kwargs, i=i: out.__setitem__(f"attn_in.{i}", (args[0] if args else kwargs["hidden_states"]).detach().clone()),
            with_kwargs=True))
        hooks.append(layer.self_attn.register_forward_hook(
            lambda m, args, res, i=i: out.__setitem__(f"attn_out.{i}", res[0].detach().clone())))
    hooks.append(model.model.norm.register_forward_hook(
        lambda m, args, res: out.__setitem__("final_norm_out", res.detach().clone())))
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    for h in hooks:
        h.remove()
    lp = torch.log_softmax(logits, -1)
    nll = -lp[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    out.update({"input_ids": ids.to(torch.int32), "logits": logits, "token_nll": nll, "mean_nll": nll.mean().reshape(1)})
    prompt = ids[:1, :8]
    with torch.no_grad():
        gen = model.generate(prompt, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0,
                             min_new_tokens=24)
    out["generate.prompt"] = prompt.to(torch.int32)
    out["generate.output"] = gen.to(torch.int32)
    return {k: v.contiguous() for k, v in out.items()}


def main(root):
    torch.manual_seed(0)
    for kind, arch in [("qwen2", transformers.Qwen2ForCausalLM), ("qwen3", transformers.Qwen3ForCausalLM),
                       ("mistral", transformers.MistralForCausalLM)]:
        model = perturbed(arch(config(kind))).float().eval()
        folder = os.path.join(root, f"{kind}-tiny")
        model.save_pretrained(folder, safe_serialization=True)
        ids = torch.randint(3, 512, (2, 33))
        save_file(reference(model, ids), os.path.join(folder, "reference.safetensors"),
                  metadata={"transformers": transformers.__version__, "torch": torch.__version__})
        print(f"{folder}: mean nll {reference(model, ids)['mean_nll'].item():.4f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden")
