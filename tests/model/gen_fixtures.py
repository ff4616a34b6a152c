#!/usr/bin/env python3
"""Reference fixtures for the qwen model plugin: tiny random Qwen3.5 text models built and run
with Hugging Face transformers (pinned 5.17.0), fp32 on CPU.

For each model: <out>/<name>/ckpt/ (config.json + safetensors, as qrun loads them) and
<out>/<name>/ref.safetensors with, per sample i, input_ids.i, labels.i, logits.i [T, V], and the
objective's value `loss` = (sum of per-sample CE sums) / (total loss tokens), plus grad.<hf name>
of that objective for every parameter (names with the `model.` prefix, lm_head only when untied),
and noise.<hf name>: that gradient's own fp32 rounding noise (see below).
Each sample runs alone through transformers (its linear-attention path does not reset state in a
packed batch), so qrun's packed batch of the same samples must reproduce these numbers.

Variants cover: GQA ratios 2 and 4 and 1 (MHA), value/key head ratios 1 and 3, tied and untied,
both key prefixes (`model.` and `model.language_model.` with a nested text_config), rope given as
rope_parameters or as legacy rope_theta/partial_rotary_factor, explicit layer_types or the
full_attention_interval default, and stray mtp.* / model.visual.* tensors that must be skipped.

usage: gen_fixtures.py OUT_DIR
"""
import copy
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

import transformers
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

SAMPLE_LENS = [1, 5, 70, 130]

MODELS = {
    # name: (config kwargs, tied, prefix style, rope style)
    "gqa2_r1_untied": (dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                            linear_num_key_heads=2, linear_num_value_heads=2,
                            linear_key_head_dim=16, linear_value_head_dim=16),
                       False, "model", "parameters"),
    "gqa4_r3_tied_vlm": (dict(num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                              linear_num_key_heads=2, linear_num_value_heads=6,
                              linear_key_head_dim=16, linear_value_head_dim=8,
                              layer_types=["linear_attention", "full_attention",
                                           "linear_attention", "full_attention"]),
                         True, "language_model", "legacy"),
    "mha_r3_untied_vlm": (dict(num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                               linear_num_key_heads=1, linear_num_value_heads=3,
                               linear_key_head_dim=16, linear_value_head_dim=16,
                               partial_rotary_factor=0.5),
                          False, "language_model", "parameters"),
}


def build(name, kw, tied):
    kw = dict(kw)
    prf = kw.pop("partial_rotary_factor", 0.25)
    cfg = Qwen3_5TextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        linear_conv_kernel_dim=4, rms_norm_eps=1e-6, tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0 if tied else 1e7,
                         "partial_rotary_factor": prf},
        **kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(sum(map(ord, name)))
    model = Qwen3_5ForCausalLM(cfg).float()
    # HF initialises the norm offsets to 0 and dt_bias to 1: perturb everything so every
    # parameter (and the zero-centred formula) matters.
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.2 if p.dim() == 1 else 0.02))
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


def save_checkpoint(model, cfg, ckpt, prefix, rope_style):
    model.save_pretrained(ckpt, safe_serialization=True)
    conf = json.load(open(os.path.join(ckpt, "config.json")))
    if rope_style == "legacy":
        rp = conf.pop("rope_parameters")
        conf["rope_theta"] = rp["rope_theta"]
        conf["partial_rotary_factor"] = rp["partial_rotary_factor"]
    if prefix == "language_model":
        # The image-text-to-text layout of the published checkpoints: nested text_config,
        # model.language_model.* keys, tie_word_embeddings at top level, mtp/visual extras.
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
        text["model_type"] = "qwen3_5_text"
        text.pop("architectures", None)
        conf = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
                "tie_word_embeddings": text.get("tie_word_embeddings", False),
                "text_config": text, "vision_config": {"depth": 1}}
    json.dump(conf, open(os.path.join(ckpt, "config.json"), "w"), indent=2)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(2)
    assert transformers.__version__.startswith("5."), transformers.__version__
    for name, (kw, tied, prefix, rope_style) in MODELS.items():
        model, cfg = build(name, kw, tied)
        g = torch.Generator().manual_seed(7)
        samples = []
        for L in SAMPLE_LENS:
            ids = torch.randint(0, cfg.vocab_size, (L,), generator=g)
            labels = ids.clone()
            drop = torch.rand(L, generator=g) < 0.2
            labels[drop] = -100
            samples.append((ids, labels))
        loss, logits = run_reference(model, samples)
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        ref = {"loss": loss.reshape(1)}
        for i, ((ids, labels), lg) in enumerate(zip(samples, logits)):
            ref[f"input_ids.{i}"] = ids
            ref[f"labels.{i}"] = labels
            ref[f"logits.{i}"] = lg.contiguous()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        for n, gr in grads.items():
            ref[f"grad.{n}"] = gr.contiguous()
        # Rounding noise of each gradient: transformers fp32 vs the same model with fp64 weights
        # (its GDN core still runs in fp32). The gradients on the decay path (A_log, dt_bias,
        # in_proj_a) are sums of many cancelling terms, so their fp32 values carry errors far above
        # 1e-4 in any implementation (up to 1.6e-2 here); the test allows max(1e-4, 3 x this noise)
        # per tensor and lets only the decay path exceed 1e-4.
        m64 = copy.deepcopy(model).double()
        run_reference(m64, samples)
        for n, p in m64.named_parameters():
            if n in grads:
                noise = ((grads[n].double() - p.grad).abs().max() / p.grad.abs().max()).float()
                ref[f"noise.{n}"] = noise.reshape(1)
        save_file(ref, os.path.join(d, "ref.safetensors"))
        # Sharded save for one model (several shards + index), single file for the others.
        ckpt = os.path.join(d, "ckpt")
        if name == "gqa2_r1_untied":
            model.save_pretrained(ckpt, safe_serialization=True, max_shard_size="100KB")
            conf = json.load(open(os.path.join(ckpt, "config.json")))
            json.dump(conf, open(os.path.join(ckpt, "config.json"), "w"), indent=2)
        else:
            save_checkpoint(model, cfg, ckpt, prefix, rope_style)
        print(f"{name}: loss {loss.item():.6f}, {len(ref)} tensors")


if __name__ == "__main__":
    main()
