"""The named peer for the CUDA benchmarks: Hugging Face transformers on the same GPU, with a
Llama-3.1-8B-shaped model of random bf16 weights (SDPA attention; batch-1 decode over a
static KV cache, which transformers compiles with torch.compile). Run on the GPU host (it
needs torch and transformers):

    python3 bench/torch_peer.py [--phases decode,prefill,throughput] [--out DIR]

Prints one line per measurement and a table last. Times are CUDA-synchronised wall clocks,
after one warm-up of each shape.
"""
import argparse
import json
import os
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def llama_8b_config():
    return LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start, result


def generate(model, batch, prompt, new_tokens, static):
    ids = torch.randint(0, 128000, (batch, prompt), device="cuda")
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                  pad_token_id=0)
    if static:
        kwargs["cache_implementation"] = "static"
    return model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)


def decode_batch1(model, results):
    # Decode rate = the extra tokens over the extra time, so prefill cancels out. A static
    # cache makes transformers compile the model for each cache size: both sizes warm up
    # (and compile) before anything is timed.
    generate(model, 1, 128, 32, True)
    generate(model, 1, 128, 288, True)
    short, _ = timed(lambda: generate(model, 1, 128, 32, True))
    long, _ = timed(lambda: generate(model, 1, 128, 288, True))
    rate = 256 / (long - short)
    results["decode_batch1_tokens_per_s"] = rate
    print(f"decode, batch 1, static cache: {rate:.1f} tokens/s", flush=True)


def prefill(model, results):
    ids = torch.randint(0, 128000, (1, 8192), device="cuda")
    with torch.no_grad():
        model(ids[:, :1024], logits_to_keep=1)
        seconds, _ = timed(lambda: model(ids, logits_to_keep=1))
    params = sum(p.numel() for p in model.parameters()) - 128256 * 4096  # the embedding is a gather
    flops = 2 * params * 8192 + 32 * 4 * 8192 * 8192 * 4096 / 2  # matmuls + causal attention
    results["prefill_8k_seconds"] = seconds
    results["prefill_8k_tflops"] = flops / seconds / 1e12
    print(f"prefill, 8192 tokens: {seconds * 1e3:.0f} ms, {flops / seconds / 1e12:.0f} TFLOP/s",
          flush=True)


def throughput(model, results, concurrency):
    # A static cache: the dynamic one re-copies every layer's K/V at each step.
    generate(model, concurrency, 1000, 4, True)  # warm-up of this batch shape
    seconds, _ = timed(lambda: generate(model, concurrency, 1000, 1000, True))
    rate = concurrency * 1000 / seconds
    torch.cuda.empty_cache()  # the next batch size allocates its own static cache
    results[f"throughput_{concurrency}_tokens_per_s"] = rate
    print(f"{concurrency} requests x (1000 in, 1000 out): {seconds:.1f} s, "
          f"{rate:.0f} output tokens/s", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", default="decode,prefill,throughput",
                        help="comma-separated: decode, prefill, throughput")
    parser.add_argument("--concurrency", default="64,256", help="throughput batch sizes")
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for results.json")
    args = parser.parse_args()
    # Static caches of several batch sizes come and go: let freed blocks be reused.
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(llama_8b_config())
    model.eval()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters", flush=True)
    results = {}
    phases = args.phases.split(",")
    with torch.no_grad():
        if "decode" in phases:
            decode_batch1(model, results)
        if "prefill" in phases:
            prefill(model, results)
        if "throughput" in phases:
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                throughput(model, results, concurrency)
    with open(os.path.join(args.out, "torch_peer.json"), "w") as f:
        json.dump(results, f, indent=2)
    print("\n== torch peer ==")
    for key, value in results.items():
        print(f"{key:40} {value:10.1f}")


if __name__ == "__main__":
    main()
