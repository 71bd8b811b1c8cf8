"""The memory-bandwidth roofline of decoding: each decode step reads every weight a token
needs once (for the whole batch) and each sequence's KV cache, so

    aggregate tok/s limit = c * bandwidth / (weight bytes per token + c * KV bytes per sequence)

for c sequences decoding together. Bandwidth is measured on the machine, with the same MLX
build the servers use, by `python bench/roofline.py bandwidth` (prints JSON).

Weight bytes per token come from the safetensors headers (exact on-disk sizes, quantized or
not): all tensors, except that an untied input embedding costs one row per token and routed
MoE experts cost top_k / n_experts of their stacked tensors.
"""

import json, struct, sys, time
from pathlib import Path


def measure_bandwidth(gib=None, repeats=10) -> dict:
    """Best GB/s (1e9 bytes/s) of MLX reading a large float32 array on the default device, by
    a sum (reads N bytes) and by an elementwise op (reads N, writes N), each timed over
    `repeats` evaluations after two untimed ones."""
    import mlx.core as mx
    gpu = mx.default_device() == mx.gpu
    gib = gib or (2.0 if gpu else 0.5)
    n = int(gib * (1 << 30)) // 4
    x = mx.random.uniform(shape=(n,))
    mx.eval(x)
    results = {}
    for name, op, bytes_moved in (("sum", lambda: mx.sum(x), 4 * n), ("scale", lambda: x * 1.5, 8 * n)):
        best = float("inf")
        for i in range(repeats + 2):
            t0 = time.perf_counter()
            mx.eval(op())
            mx.synchronize()
            dt = time.perf_counter() - t0
            if i >= 2:
                best = min(best, dt)
        results[name] = bytes_moved / best / 1e9
    method = (f"MLX {mx.__version__} on {mx.default_device()}: best of {repeats} timed evaluations over a "
              f"{gib:g} GiB float32 array, sum (reads it) {results['sum']:.1f} GB/s, x*1.5 (reads and writes it) "
              f"{results['scale']:.1f} GB/s; the higher is used")
    return {"bandwidth_gbs": max(results.values()), "bandwidth_method": method, "bandwidth_samples": results}


def safetensors_sizes(model_dir: Path) -> dict:
    """{tensor name: (dtype, shape, bytes)} from the headers of every *.safetensors file."""
    sizes = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, t in header.items():
            if name != "__metadata__":
                a, b = t["data_offsets"]
                sizes[name] = (t["dtype"], t["shape"], b - a)
    return sizes


def weight_bytes_on_disk(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors"))


def text_config(config: dict) -> dict:
    return config.get("text_config", config)


def weight_bytes_per_token(model_dir: Path) -> tuple[int, str]:
    """(bytes, note): weight bytes one decoded token reads."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    tc = text_config(config)
    tied = config.get("tie_word_embeddings", tc.get("tie_word_embeddings", False))
    n_experts = tc.get("num_experts") or tc.get("num_local_experts") or tc.get("n_routed_experts")
    top_k = tc.get("num_experts_per_tok")
    vocab = tc["vocab_size"]
    total = routed = embed = 0
    for name, (_, _, nbytes) in safetensors_sizes(model_dir).items():
        if "embed_tokens" in name and not tied:
            embed += nbytes
            total += nbytes / vocab  # a lookup reads one row
        elif n_experts and top_k and (".switch_mlp." in name or ".experts." in name):
            routed += nbytes
            total += nbytes * top_k / n_experts
        else:
            total += nbytes
    note = "all weight tensors"
    if tied:
        note += " (embedding tied to the output projection: read whole)"
    elif embed:
        note += f" except the input embedding ({embed / 1e9:.2f} GB), one row per token"
    if routed:
        note += f"; routed experts ({routed / 1e9:.2f} GB) at {top_k}/{n_experts}"
    return int(total), note


def activation_bytes(model_dir: Path) -> int:
    """Bytes of one activation (the KV cache's element): the dtype of the norm weights."""
    for name, (dtype, _, _) in safetensors_sizes(model_dir).items():
        if "norm" in name:
            return {"F32": 4, "BF16": 2, "F16": 2}.get(dtype, 2)
    return 2


def kv_bytes_per_token(model_dir: Path, kv_bits=None, group_size=64) -> int:
    """KV cache bytes per cached token over all layers. Quantized: `kv_bits` per element plus a
    scale and a bias (activation dtype) per group, as MLX's quantized KV cache stores them."""
    tc = text_config(json.loads((Path(model_dir) / "config.json").read_text()))
    heads = tc["num_attention_heads"]
    kv_heads = tc.get("num_key_value_heads", heads)
    head_dim = tc.get("head_dim") or tc["hidden_size"] // heads
    elems = 2 * tc["num_hidden_layers"] * kv_heads * head_dim  # keys and values
    act = activation_bytes(model_dir)
    if kv_bits:
        return int(elems * (kv_bits / 8 + 2 * act / group_size))
    return elems * act


def roofline_tps(bandwidth_gbs, weight_bytes, kv_bytes_per_token, context, concurrency, gen_tokens) -> float:
    """Aggregate decode tok/s the bandwidth allows: per step the weights once and each of the c
    sequences' caches, at their mean length over the generation."""
    kv_per_seq = kv_bytes_per_token * (context + gen_tokens / 2)
    return concurrency * bandwidth_gbs * 1e9 / (weight_bytes + concurrency * kv_per_seq)


if __name__ == "__main__":
    if sys.argv[1:] == ["bandwidth"]:
        print(json.dumps(measure_bandwidth()))
    elif len(sys.argv) == 3 and sys.argv[1] == "weights":
        print(json.dumps(dict(zip(("weight_bytes_per_token", "note"), weight_bytes_per_token(Path(sys.argv[2]))))))
    else:
        sys.exit("usage: python bench/roofline.py bandwidth | weights MODEL_DIR")
