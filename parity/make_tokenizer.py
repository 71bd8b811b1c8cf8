"""A small byte-level BPE tokenizer trained offline on a fixed text, saved in the
Hugging Face layout (tokenizer.json + tokenizer_config.json with a ChatML chat
template), so tiny parity models have a real tokenizer of an exact vocab size."""

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
import json

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

WORDS = (
    "the of and to in is was for on that with as by at from his her are an "
    "which this be or have it not were had but they one their all has been "
    "model token server memory cache layer weight attention value key query "
    "stream expert quantize metal cuda apple silicon rust python benchmark "
    "hello world résumé naïve café 東京 数据 мир 🙂 ✓"
).split()


def corpus():
    # Deterministic pseudo-random sentences (LCG), no external data.
    x = 12345
    lines = []
    for _ in range(4000):
        words = []
        for _ in range(12):
            x = (1103515245 * x + 12345) % (1 << 31)
            words.append(WORDS[x % len(WORDS)])
        lines.append(" ".join(words) + ".")
    return lines


def write_tokenizer(out: Path, vocab_size: int) -> int:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    # Pad the BPE vocabulary (not the added tokens, which every encode scans)
    # with unreachable entries up to the size of the model's embedding.
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    n = tok.get_vocab_size()
    for i in range(n, vocab_size):
        vocab[f"<|unused_{i}|>"] = i
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "chat_template": CHATML,
                "model_max_length": 4096,
            },
            indent=2,
        )
    )
    return max(n, vocab_size)
