"""Times a prompt-cache hit right after its cold request on a running mlx-serve, twice with
different prefixes: the first hit of a process pays any one-time (JIT) cost, the second
shows the steady state. Prints one JSON line per request.

usage: python bench/cache_hit_probe.py BASE_URL PREFIX_WORDS
"""
import json, sys, time

import httpx

WORDS = "the model token server memory cache layer weight attention value key query stream".split()


def ask(base, system, question):
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": 8, "ignore_eos": True}
    t = time.perf_counter()
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=600).json()
    return {"s": round(time.perf_counter() - t, 3), "cached": r["usage"]["prompt_tokens_details"]["cached_tokens"],
            "prompt": r["usage"]["prompt_tokens"]}


def main():
    base, n = sys.argv[1], int(sys.argv[2])
    for rep in range(2):
        system = " ".join(WORDS[(i * 7 + rep * 3) % len(WORDS)] for i in range(n)) + f" variant {rep}"
        print(json.dumps({"rep": rep, "cold": ask(base, system, "first question"),
                          "hit": ask(base, system, "second question")}), flush=True)


if __name__ == "__main__":
    main()
