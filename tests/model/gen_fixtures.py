#!/usr/bin/env python3
"""Reference fixtures for the qwen model plugin: tiny random Qwen3.5 / Qwen3.5-MoE / Qwen3-Next
text models built and run with Hugging Face transformers (pinned 5.17.0) on CPU.

For each parity model: <out>/<name>/ckpt/ (config.json + safetensors, as qrun loads them) and
<out>/<name>/ref.safetensors with, per sample i, input_ids.i, labels.i, and for each precision
P in {fp32, fp64}: P.logits.i [T, V], P.loss = (sum of per-sample CE sums) / (total loss tokens)
and P.grad.<hf name> of that objective for every parameter (transformers' in-memory names: the
`model.` prefix, lm_head only when untied, MoE experts fused as mlp.experts.gate_up_proj /
down_proj); noise.<hf name>: the relative error of the fp32 gradient against the fp64 one (the
rounding noise any fp32 implementation shows); strong_decay: 1 for the model whose decays are
strong (see below).
Each sample runs alone through transformers (its linear-attention path does not reset state in a
packed batch), so qrun's packed batch of the same samples must reproduce these numbers.

fp64: the model and inputs in float64. transformers upcasts to fp32 inside its norms, the GDN core,
softmaxes, the router and the loss ("at least fp32"); keep_fp64() makes those upcasts keep fp64
tensors in fp64 for the fp64 run, so the whole reference computes in fp64 (without it, the fp64
run would still round the GDN core to fp32).

Decay strength: the Gated DeltaNet decay per token is exp(g), g = -exp(A_log)·softplus(a + dt_bias).
transformers initialises A = exp(A_log) ~ U(0.01, 16): heads with A of several units forget their
state within a token, and their A_log / dt_bias gradients are near-zero sums of O(1) terms, which
fp32 cannot resolve (measured: 1e-3..3e-3 relative in transformers' own fp32 vs fp64). With
A ~ U(0.01, 1) (per-token decays from 0.99 to 0.27) the same gradients carry 1e-5 of fp32 noise.
So every model but one draws A from U(0.01, 1) and its fp32 gradients must all match to 1e-4;
the `strong_decay` model keeps transformers' initialisation and its decay-path gradients are
bounded by the measured noise (the fp64 comparison is strict for every model).

Variants cover: GQA ratios 2 and 4 and 1 (MHA), value/key head ratios 1, 2 and 3, tied and
untied, both key prefixes (`model.` and `model.language_model.` with a nested text_config), rope
given as rope_parameters or as legacy rope_theta/partial_rotary_factor, explicit layer_types or the
full_attention_interval default, stray mtp.* / model.visual.* tensors that must be skipped, the
Qwen3-Next fused in_proj_qkvz / in_proj_ba layout, sparse MoE MLPs (norm_topk_prob on and
off, decoder_sparse_step, mlp_only_layers, per-expert hub keys), and a plain Qwen3 dense model.

Also <out>/vlm_full/ckpt: a tiny Qwen3_5ForConditionalGeneration (text + a one-block vision tower)
as save_pretrained writes it, plus an mtp.* tensor, for the save-layout test.

usage: gen_fixtures.py OUT_DIR
"""
import contextlib
import copy
import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import transformers
from transformers import (Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration,
                          Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig,
                          Qwen3Config, Qwen3ForCausalLM, Qwen3NextConfig, Qwen3NextForCausalLM)

SAMPLE_LENS = [1, 5, 70, 130]

MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           shared_expert_intermediate_size=48)

MODELS = {
    # name: (family, config kwargs, tied, prefix style, rope style, strong decay)
    "gqa2_r1_untied": ("qwen3_5", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                       linear_num_key_heads=2, linear_num_value_heads=2,
                                       linear_key_head_dim=16, linear_value_head_dim=16),
                       False, "model", "parameters", False),
    "gqa4_r3_tied_vlm": ("qwen3_5", dict(num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                                         linear_num_key_heads=2, linear_num_value_heads=6,
                                         linear_key_head_dim=16, linear_value_head_dim=8,
                                         layer_types=["linear_attention", "full_attention",
                                                      "linear_attention", "full_attention"]),
                         True, "language_model", "legacy", True),
    "mha_r3_untied_vlm": ("qwen3_5", dict(num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                                          linear_num_key_heads=1, linear_num_value_heads=3,
                                          linear_key_head_dim=16, linear_value_head_dim=16,
                                          partial_rotary_factor=0.5),
                          False, "language_model", "parameters", False),
    # Qwen3-Next: fused projections, value/key ratio 2, MoE on layers 0, 1, 3 (2 is dense).
    "next_r2_moe": ("qwen3_next", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                       linear_num_key_heads=2, linear_num_value_heads=4,
                                       linear_key_head_dim=16, linear_value_head_dim=8,
                                       intermediate_size=96, decoder_sparse_step=1,
                                       mlp_only_layers=[2], norm_topk_prob=True, **MOE),
                    False, "model", "parameters", False),
    # Qwen3-Next: ratio 1, MoE on layers 1 and 3 (decoder_sparse_step 2), top-k not renormalised.
    "next_r1_step2_tied": ("qwen3_next", dict(num_attention_heads=2, num_key_value_heads=1,
                                              head_dim=32, linear_num_key_heads=2,
                                              linear_num_value_heads=2, linear_key_head_dim=16,
                                              linear_value_head_dim=16, intermediate_size=96,
                                              decoder_sparse_step=2, norm_topk_prob=False, **MOE),
                           True, "model", "parameters", False),
    # Qwen3.5-MoE in the image-text-to-text layout (every MLP sparse).
    "moe35_r3_vlm": ("qwen3_5_moe", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                         linear_num_key_heads=1, linear_num_value_heads=3,
                                         linear_key_head_dim=16, linear_value_head_dim=16, **MOE),
                     False, "language_model", "parameters", False),
    # Plain Qwen3 dense (the second family): full attention only, no output gate, plain norms.
    "qwen3_gqa2_tied": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16),
                        True, "model", "parameters", False),
}


@contextlib.contextmanager
def keep_fp64():
    """Within the fp64 run, transformers' fp32 upcasts (Tensor.float(), .to(torch.float32),
    softmax(dtype=torch.float32)) leave fp64 tensors in fp64; integer tensors (RoPE positions)
    become fp64 too."""
    T = torch.Tensor
    orig_float, orig_to, orig_softmax = T.float, T.to, F.softmax

    def to_float(self, *a, **k):
        if self.dtype == torch.float64:
            return self
        if not self.is_floating_point():
            return self.double()
        return orig_float(self, *a, **k)

    def to(self, *a, **k):
        if self.dtype == torch.float64:
            a = tuple(torch.float64 if x is torch.float32 else x for x in a)
            if k.get("dtype") is torch.float32:
                k["dtype"] = torch.float64
        return orig_to(self, *a, **k)

    def softmax(x, *a, **k):
        if x.dtype == torch.float64 and k.get("dtype") is torch.float32:
            k["dtype"] = torch.float64
        return orig_softmax(x, *a, **k)

    T.float, T.to, F.softmax = to_float, to, softmax
    try:
        yield
    finally:
        T.float, T.to, F.softmax = orig_float, orig_to, orig_softmax


def build(name, family, kw, tied, strong_decay):
    kw = dict(kw)
    prf = kw.pop("partial_rotary_factor", 0.25)
    common = dict(vocab_size=512, hidden_size=64, num_hidden_layers=4, linear_conv_kernel_dim=4,
                  rms_norm_eps=1e-6, tie_word_embeddings=tied,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0 if tied else 1e7,
                                   "partial_rotary_factor": prf})
    if family == "qwen3":
        common.pop("linear_conv_kernel_dim")
        common["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
        cfg, cls = Qwen3Config(intermediate_size=128, **common, **kw), Qwen3ForCausalLM
    elif family == "qwen3_5":
        cfg, cls = Qwen3_5TextConfig(intermediate_size=128, **common, **kw), Qwen3_5ForCausalLM
    elif family == "qwen3_5_moe":
        cfg, cls = Qwen3_5MoeTextConfig(**common, **kw), Qwen3_5MoeForCausalLM
    else:
        cfg, cls = Qwen3NextConfig(**common, **kw), Qwen3NextForCausalLM
    cfg._attn_implementation = "eager"
    torch.manual_seed(sum(map(ord, name)))
    model = cls(cfg).float()
    # The per-expert loop (grouped_mm, transformers' default on CPU, has no fp64 kernel).
    model.config._experts_implementation = "eager"
    # HF initialises the norm offsets to 0 and dt_bias to 1: perturb everything so every
    # parameter (and the zero-centred formula) matters. Router weights get a larger scale so the
    # top-k choice is decisive (checked in route_gaps()).
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.2 if p.dim() == 1 else 0.5 if n.endswith("mlp.gate.weight")
                                          else 0.02))
            if n.endswith("A_log") and not strong_decay:
                p.copy_(torch.empty_like(p).uniform_(0.01, 1.0).log())
    model.eval()
    return model, cfg


def run_reference(model, samples):
    model.zero_grad()
    total_tokens = 0
    loss_sums = []
    logits = []
    for ids, labels in samples:
        out = model(input_ids=ids[None], labels=labels[None])
        n = int((labels[1:] != -100).sum())
        total_tokens += n
        logits.append(out.logits[0].detach())
        loss_sums.append(out.loss * n if n > 0 else out.logits.sum() * 0)
    loss = torch.stack(loss_sums).sum() / total_tokens
    loss.backward()
    return loss.detach(), logits


def route_gaps(model, samples):
    """Smallest gap between the k-th and (k+1)-th router logit over all tokens and MoE layers
    (softmax is monotonic): a near tie would make the expert choice depend on rounding."""
    gaps = []

    def hook(mod, inp, out):
        logits = out[0].double()
        top = logits.topk(min(mod.top_k + 1, logits.shape[-1]), -1).values
        if top.shape[-1] > mod.top_k:
            gaps.append(float((top[:, mod.top_k - 1] - top[:, mod.top_k]).min()))

    hs = [m.register_forward_hook(hook) for n, m in model.named_modules() if n.endswith("mlp.gate")]
    with torch.no_grad():
        for ids, _ in samples:
            model(input_ids=ids[None])
    for h in hs:
        h.remove()
    return min(gaps) if gaps else None


def to_vlm_layout(ckpt, conf, family):
    """The image-text-to-text layout of the published checkpoints: nested text_config,
    model.language_model.* keys, tie_word_embeddings at top level, mtp/visual extras."""
    files = [f for f in os.listdir(ckpt) if f.endswith(".safetensors")]
    for f in files:
        sd = load_file(os.path.join(ckpt, f))
        sd = {(k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
              for k, v in sd.items()}
        sd["mtp.fc.weight"] = torch.zeros(4, 4)
        sd["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(3, 2)
        save_file(sd, os.path.join(ckpt, f), metadata={"format": "pt"})
    idx = os.path.join(ckpt, "model.safetensors.index.json")
    if os.path.exists(idx):
        j = json.load(open(idx))
        j["weight_map"] = {(k.replace("model.", "model.language_model.", 1)
                            if k.startswith("model.") else k): v
                           for k, v in j["weight_map"].items()}
        json.dump(j, open(idx, "w"), indent=2)
    text = dict(conf)
    text["model_type"] = family + "_text"
    text.pop("architectures", None)
    arch = "Qwen3_5MoeForConditionalGeneration" if family == "qwen3_5_moe" else "Qwen3_5ForConditionalGeneration"
    return {"architectures": [arch], "model_type": family,
            "tie_word_embeddings": text.get("tie_word_embeddings", False),
            "text_config": text, "vision_config": {"depth": 1}}


def save_checkpoint(model, family, ckpt, prefix, rope_style, sharded):
    if sharded:
        model.save_pretrained(ckpt, safe_serialization=True, max_shard_size="100KB")
    else:
        model.save_pretrained(ckpt, safe_serialization=True)
    conf = json.load(open(os.path.join(ckpt, "config.json")))
    if rope_style == "legacy":
        rp = conf.pop("rope_parameters")
        conf["rope_theta"] = rp["rope_theta"]
        conf["partial_rotary_factor"] = rp["partial_rotary_factor"]
    if prefix == "language_model":
        conf = to_vlm_layout(ckpt, conf, family)
    json.dump(conf, open(os.path.join(ckpt, "config.json"), "w"), indent=2)


def parity_fixture(out, name, spec):
    family, kw, tied, prefix, rope_style, strong = spec
    model, cfg = build(name, family, kw, tied, strong)
    g = torch.Generator().manual_seed(7)
    samples = []
    for L in SAMPLE_LENS:
        ids = torch.randint(0, cfg.vocab_size, (L,), generator=g)
        labels = ids.clone()
        drop = torch.rand(L, generator=g) < 0.2
        labels[drop] = -100
        samples.append((ids, labels))
    gap = route_gaps(model, samples)
    assert gap is None or gap > 1e-4, f"{name}: router top-k near tie ({gap:.2e}); change the seed"
    ref = {"strong_decay": torch.tensor([1.0 if strong else 0.0])}
    for i, (ids, labels) in enumerate(samples):
        ref[f"input_ids.{i}"] = ids
        ref[f"labels.{i}"] = labels
    m64 = copy.deepcopy(model).double()
    grads = {}
    for prec, m in (("fp32", model), ("fp64", m64)):
        if prec == "fp64":
            with keep_fp64():
                loss, logits = run_reference(m, samples)
        else:
            loss, logits = run_reference(m, samples)
        ref[f"{prec}.loss"] = loss.reshape(1)
        for i, lg in enumerate(logits):
            ref[f"{prec}.logits.{i}"] = lg.contiguous()
        grads[prec] = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
        for n, gr in grads[prec].items():
            ref[f"{prec}.grad.{n}"] = gr.contiguous()
    worst = (0.0, "")
    for n, g32 in grads["fp32"].items():
        g64 = grads["fp64"][n]
        noise = float((g32.double() - g64).abs().max() / g64.abs().max())
        ref[f"noise.{n}"] = torch.tensor([noise], dtype=torch.float64)
        worst = max(worst, (noise, n))
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    save_file(ref, os.path.join(d, "ref.safetensors"))
    # Sharded save for one model (several shards + index), single file for the others.
    save_checkpoint(model, family, os.path.join(d, "ckpt"), prefix, rope_style,
                    sharded=(name == "gqa2_r1_untied"))
    print(f"{name}: loss fp32 {ref['fp32.loss'].item():.6f} fp64 {ref['fp64.loss'].item():.9f}, "
          f"worst fp32-vs-fp64 grad noise {worst[0]:.2e} ({worst[1]})"
          + (f", min router logit gap {gap:.2e}" if gap is not None else ""))


def vlm_fixture(out):
    """A tiny Qwen3_5ForConditionalGeneration as transformers saves it (+ one mtp.* tensor as in
    the published checkpoints), for the save-layout round trip."""
    text = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                  patch_size=4, num_position_embeddings=16)
    torch.manual_seed(11)
    model = Qwen3_5ForConditionalGeneration(
        Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)).float()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.2 if p.dim() == 1 else 0.02))
    ckpt = os.path.join(out, "vlm_full", "ckpt")
    model.save_pretrained(ckpt, safe_serialization=True)
    f = os.path.join(ckpt, "model.safetensors")
    sd = load_file(f)
    sd["mtp.fc.weight"] = torch.randn(64, 128).to(torch.bfloat16)
    save_file(sd, f, metadata={"format": "pt"})
    n_visual = sum(k.startswith("model.visual.") for k in sd)
    print(f"vlm_full: {len(sd)} tensors ({n_visual} visual, 1 mtp)")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(2)
    assert transformers.__version__.startswith("5."), transformers.__version__
    for name, spec in MODELS.items():
        parity_fixture(out, name, spec)
    vlm_fixture(out)


if __name__ == "__main__":
    main()
