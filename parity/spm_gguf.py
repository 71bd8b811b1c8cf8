"""SentencePiece BPE tokenizers as GGUF files, with SentencePiece's own ids.

Trains a tiny SentencePiece BPE model (byte fallback, user-defined symbols,
<unk>=0 <s>=1 </s>=2 as sentencepiece has them) the way Llama 2's and Gemma's
were trained (identity normalization, whitespace kept as is, digits split),
once with a dummy "▁" prefix (Llama) and once without (Gemma), and writes each
as a GGUF file holding the tokenizer as llama.cpp's converter writes a
SentencePiece model (tokenizer.ggml.*). Beside each, SentencePiece's ids and
decoded text for a list of texts, for the Rust side to compare.

    spm_gguf.py OUT_DIR            -> OUT_DIR/{prefix,noprefix}.gguf, reference.json
    spm_gguf.py --synthetic N PATH -> PATH: a GGUF file of an N-piece vocabulary
                                      (BPE-like pieces, for timing the build)
"""

import io
import json
import random
import sys
from pathlib import Path

import numpy as np
import sentencepiece as spm
from gguf import GGUFWriter
from sentencepiece import sentencepiece_model_pb2 as pb

# Gemma's turn markers, and two with regex metacharacters in them.
USER_DEFINED = ["<start_of_turn>", "<end_of_turn>", "<|tool|>", "[/TOOL]"]

WORDS = (
    "the of and to in is was for on that with as by at from his her are an "
    "which this be or have it not were had but they one their all has been "
    "model token server memory cache layer weight attention value key query "
    "stream expert quantize metal apple silicon rust python benchmark "
    "hello world résumé naïve café über señor 東京 数据 мир 🙂 ✓ "
    "2024 3.14 42 1,000 (x) [y] {z} a+b=c x*y; q? yes! \"quoted\" 'single' -- ... #tag @user"
).split()

SYLLABLES = "ka ri to mu sen la po ve nor tha qui bre ing ion ed er st".split()

# SentencePiece's ids for each of these. Ω, 🦀, क्ष and ╬ never occur in the
# corpus: they fall back to bytes.
TEXTS = [
    "Hello world",
    "hello world.",
    " leading space",
    "   three leading spaces",
    "trailing space ",
    "trailing spaces   ",
    "two  spaces and   three and    four",
    "line one\nline two\n\nline four\n",
    "\nstarts with a newline",
    "tabs\tand\ttabs",
    "digits 1234567890 and 3.14159 and 1,000,000",
    "2024-05-17T12:34:56Z",
    "punctuation!? (brackets) [square] {curly} <angle> \"quotes\" 'single' -- ... #tag @user",
    "résumé naïve café über señor",
    "東京 数据 мир",
    "emoji 🙂 ✓ and unknown 🦀 Ω क्ष ╬",
    "🦀",
    "Ω",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "text before <start_of_turn> and after",
    "glued<start_of_turn>glued<end_of_turn>",
    "<end_of_turn>",
    "call <|tool|>{\"x\": 1}[/TOOL] done|tool|[TOOL]",
    " ",
    "  ",
    "\n",
    "a",
    "the model token server memory cache layer weight attention value key query stream expert",
    "mixed: Hello, 世界! 123 café 🙂\n\n  indented   text\t end ",
    "a literal ▁ and ▁▁ in the text",
    "windows\r\nline ends\r\n",
    "",
]


def corpus():
    # Deterministic pseudo-random lines (a seeded generator, no external
    # data): words, made-up words, single and multiple spaces, tabs and
    # newlines inside lines, the user-defined symbols now and then.
    rng = random.Random(1234)
    lines = []
    for i in range(3000):
        parts = []
        for _ in range(12):
            if rng.random() < 0.7:
                word = rng.choice(WORDS)
            else:
                word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4)))
            parts.append(word.capitalize() if rng.random() < 0.1 else word)
            parts.append(rng.choice(["  ", "   ", "\n", "\t", "    ", "\n\n"]) if rng.random() < 0.15 else " ")
        line = "".join(parts)
        if i % 50 == 0:
            line = "<start_of_turn>user\n" + line + "<end_of_turn>"
        if i % 70 == 0:
            line += " <|tool|>" + rng.choice(WORDS) + "[/TOOL]"
        lines.append(line)
    return lines


def train(add_dummy_prefix: bool) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()),
        model_writer=model,
        model_type="bpe",
        vocab_size=800,
        byte_fallback=True,
        character_coverage=1.0,
        user_defined_symbols=USER_DEFINED,
        # As Llama 2 and Gemma: the text as is, spaces kept, digits alone.
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=add_dummy_prefix,
        allow_whitespace_only_pieces=True,
        split_digits=True,
        max_sentence_length=100000,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


# llama.cpp's token types: SentencePiece's piece types, byte as 6.
GGML_TYPE = {
    pb.ModelProto.SentencePiece.NORMAL: 1,
    pb.ModelProto.SentencePiece.UNKNOWN: 2,
    pb.ModelProto.SentencePiece.CONTROL: 3,
    pb.ModelProto.SentencePiece.USER_DEFINED: 4,
    pb.ModelProto.SentencePiece.UNUSED: 5,
    pb.ModelProto.SentencePiece.BYTE: 6,
}


def write_gguf(path, tokens, scores, types, bos, eos, unk, add_space_prefix):
    # As llama.cpp's convert_hf_to_gguf.py writes a SentencePiece vocabulary.
    w = GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_unk_token_id(unk)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(add_space_prefix)
    w.add_tensor("token_embd.weight", np.zeros((8, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def case(out: Path, name: str, add_dummy_prefix: bool) -> dict:
    blob = train(add_dummy_prefix)
    (out / f"{name}.model").write_bytes(blob)
    sp = spm.SentencePieceProcessor(model_proto=blob)
    proto = pb.ModelProto()
    proto.ParseFromString(blob)
    tokens = [p.piece for p in proto.pieces]
    scores = [p.score for p in proto.pieces]
    types = [GGML_TYPE[p.type] for p in proto.pieces]
    assert all(sp.IdToPiece(i) == t for i, t in enumerate(tokens))
    assert [i for i, t in enumerate(types) if t == 6] == [i for i in range(len(tokens)) if sp.IsByte(i)]
    bos, eos, unk = sp.bos_id(), sp.eos_id(), sp.unk_id()
    assert (unk, bos, eos) == (0, 1, 2), (unk, bos, eos)
    path = out / f"{name}.gguf"
    write_gguf(path, tokens, scores, types, bos, eos, unk, add_dummy_prefix)
    ids = [sp.EncodeAsIds(t) for t in TEXTS]
    crab, space, turn = sp.EncodeAsIds("🦀"), sp.PieceToId("▁"), sp.PieceToId("<start_of_turn>")
    decode_only = [crab[:-1], crab[:-2] + sp.EncodeAsIds("ok"), [space, space] + sp.EncodeAsIds("hi"), [turn] + sp.EncodeAsIds("hi")]
    return {
        "gguf": str(path),
        "vocab_size": len(tokens),
        "types": {str(k): types.count(k) for k in sorted(set(types))},
        "user_defined": USER_DEFINED,
        "bos": bos,
        "eos": eos,
        "texts": TEXTS,
        "ids": ids,
        "pieces": [[sp.IdToPiece(i) for i in x] for x in ids],
        # What SentencePiece decodes its ids to, BOS and EOS around them
        # (control pieces decode to nothing).
        "decoded": [sp.DecodeIds([bos] + x + [eos]) for x in ids],
        # Pieces a decoder meets mid-stream: a character's bytes cut short,
        # lone "▁" pieces first, a user-defined symbol first.
        "decode_only": [[bos] + x for x in decode_only],
        "decode_only_text": [sp.DecodeIds([bos] + x) for x in decode_only],
    }


def synthetic(n: int, path: Path):
    # A BPE-shaped vocabulary: control and byte pieces, ~5k single characters
    # (Latin, CJK), then pieces each the join of an earlier piece and a
    # frequent letter or another earlier piece, scores falling with the id as
    # SentencePiece's BPE trainer ranks them. Its pieces split into two others
    # ~2 ways each on average, so the merges number about what Gemma 3's
    # 262k vocabulary gives (~510k).
    rng = random.Random(0)
    common = ["▁"] + list("etaoinshrdlucmfwypvbgkjqxz")
    rest = [chr(c) for c in range(0x21, 0x7F)] + [chr(c) for c in range(0xC0, 0x250)] + [chr(c) for c in range(0x4E00, 0x4E00 + 4500)]
    chars = common + [c for c in rest if c not in common]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + chars
    types = [2, 3, 3] + [6] * 256 + [1] * len(chars)
    seen = set(tokens)
    normal = list(common)
    while len(tokens) < n:
        a = normal[int(len(normal) * rng.random() ** 2)]
        b = rng.choice(common) if rng.random() < 0.8 else normal[int(len(normal) * rng.random() ** 2)]
        piece = a + b
        if piece in seen or len(piece) > 16:
            continue
        seen.add(piece)
        tokens.append(piece)
        types.append(1)
        normal.append(piece)
    scores = [0.0 if t != 1 else -float(i) for i, t in enumerate(types)]
    write_gguf(path, tokens, scores, types, 1, 2, 0, True)


def main():
    if sys.argv[1] == "--synthetic":
        synthetic(int(sys.argv[2]), Path(sys.argv[3]))
        return
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    reference = {"prefix": case(out, "prefix", True), "noprefix": case(out, "noprefix", False)}
    (out / "reference.json").write_text(json.dumps(reference, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
