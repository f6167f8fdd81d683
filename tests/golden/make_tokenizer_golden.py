"""Reference ids for a tokenizer.json in Qwen2/Qwen3's form, made by Hugging Face tokenizers:

    python3 tests/golden/make_tokenizer_golden.py SMOLLM2_TOKENIZER_JSON tests/golden/qwen-form-tokenizer

No Qwen tokenizer is at hand, so the form is put on SmolLM2's vocabulary and merges
(../shared/data/tokenizers/smollm2-tokenizer.json): Qwen's normalizer (NFC) and pre-tokenizer (a Split
on Qwen's regex, isolated, then ByteLevel without its own regex), its ByteLevel decoder. The C++ test
(tests/test_tokenizer.cpp, QwenFormMatchesHuggingFaceTokenizers) makes the same file the same way and
compares its encoding of every text in cases.jsonl with the ids written here, and the decoding back.
Writes cases.jsonl: {"text", "ids"} per line, encoded without added BOS/EOS (special tokens in the text
are recognised, as transformers does by default).
"""
import json
import os
import sys

from tokenizers import Tokenizer
import tokenizers

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")

TEXTS = [
    "Hello world", " Hello world", "Hello World", "hello   world  ", "\n\n\n", "\t\n \r\n",
    "We'LL pay 12 now.\n\n  ok", "I'M sure you'Ve SEEN it; they'd've gone.", "don't DON'T Don'T",
    "2024-12-07 at 3.14159, +44 (0)20 7946 0958", "1234567890 0.5e-10 1,000,000",
    "caf\u0065\u0301 vs caf\u00e9", "A\u030a\u212b\u00c5", "\u1e9b\u0323 \ufb01 \u2168",
    "Fu\u0308hrer F\u00fchrer", "na\u00efve co\u00f6perate r\u00e9sum\u00e9",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u8fd9\u662f\u4e00\u4e2a\u6d4b\u8bd5\u3002",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002\u30ab\u30bf\u30ab\u30ca",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0415\u0451\u0436",
    "emoji \U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467 \u2764\ufe0f",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>",
    "text<|endoftext|>more text", "def f(x):\n    return x ** 2  # square\n",
    "    indented\n\tand tabbed\n", "!!!??? ... --- ___ ~~~", "$100.00 & 50% off @home #tag",
    "http://example.com/path?q=1&r=two", "a\u00a0b\u2003c\u3000d", "\u00bd \u00bc \u2153 \u00b2 \u2082",
    "x" * 40, "ab" * 30, " " * 9 + "x", "MiXeD CaSe WoRdS", "O'Neill's dog's", "'s 't 're",
]


def qwen_form(source_json):
    j = json.load(open(source_json))
    j["normalizer"] = {"type": "NFC"}
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN_SPLIT}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    j["post_processor"] = None
    return j


def main():
    source, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "tokenizer.json.tmp")
    with open(path, "w") as f:
        json.dump(qwen_form(source), f)
    tok = Tokenizer.from_file(path)
    os.remove(path)
    with open(os.path.join(out, "cases.jsonl"), "w") as f:
        for text in TEXTS:
            ids = tok.encode(text, add_special_tokens=False).ids
            f.write(json.dumps({"text": text, "ids": ids}, ensure_ascii=False) + "\n")
    with open(os.path.join(out, "VERSION"), "w") as f:
        f.write(f"tokenizers {tokenizers.__version__}\n")
    print(f"wrote {len(TEXTS)} cases to {out} (tokenizers {tokenizers.__version__})")


if __name__ == "__main__":
    main()
