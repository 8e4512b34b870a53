"""The locally trained tokenizer of the ERNIE-4.5-0.3B folder, and the script that makes it (no engine)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from tunebook.core.model import ERNIE_03B
from tunebook.core.points import Point, has_tokenizer

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_tokenizer.py"
CONFIG = json.loads((ERNIE_03B / "config.json").read_text())
TEXTS = [
    "vLLM 部署 ERNIE-4.5-0.3B-PT 性能调优：KV Cache 压缩与 prefill 优化。",
    "请用中文介绍一下人工智能的发展历史。",
    "The quick brown fox jumps over the lazy dog.  Spaces,\ttabs\nand new lines  \n\n",
    "def f(x):\n    return {'a': [1, 2.5e-3]}  # 注释",
    "emoji 😀, accents é ü, 한국어, العربية, a zero-width\u200bspace, 𠀀 (outside the BMP)",
    " leading and trailing spaces ",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(str(ERNIE_03B / "tokenizer.json"))


@pytest.fixture(scope="module")
def tok_config() -> dict:
    return json.loads((ERNIE_03B / "tokenizer_config.json").read_text())


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("make_tokenizer", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_vocabulary_is_the_models_size_and_every_id_decodes(tok):
    assert tok.get_vocab_size() == CONFIG["vocab_size"] == 103424
    ids = sorted(tok.get_vocab().values())
    assert ids == list(range(CONFIG["vocab_size"]))  # contiguous: any id the model emits decodes


def test_special_ids_match_config(tok, tok_config):
    for role, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "pad_token_id")):
        assert tok.token_to_id(tok_config[f"{role}_token"]) == CONFIG[key]
    assert [tok.id_to_token(i) for i in range(4)] == ["<pad>", "<s>", "</s>", "<unk>"]
    assert tok.token_to_id(tok_config["unk_token"]) == 3
    # No token is added on encode: prompts are exactly the text's tokens (the chat template
    # writes <s> itself).
    assert tok.encode("hello").ids == tok.encode("hello", add_special_tokens=False).ids


@pytest.mark.parametrize("text", TEXTS)
def test_text_round_trips_exactly(tok, text):
    ids = tok.encode(text).ids
    assert 3 not in ids  # byte-level: nothing is ever unknown
    assert tok.decode(ids) == text


def test_every_cjk_ideograph_is_one_token(tok):
    cjk = "".join(chr(c) for c in range(0x4E00, 0xA000, 97))
    assert all(len(tok.encode(c).ids) == 1 for c in cjk)


@pytest.mark.slow
def test_transformers_loads_it_offline_and_renders_the_chat_template(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(str(ERNIE_03B), local_files_only=True)
    assert len(t) == CONFIG["vocab_size"]
    assert (t.bos_token_id, t.eos_token_id, t.pad_token_id) == (1, 2, 0)
    for text in TEXTS:
        assert t.decode(t.encode(text)) == text  # no clean-up of spaces before punctuation
    messages = [
        {"role": "system", "content": "你是一个助手。"},
        {"role": "user", "content": "你好"},
        {"role": "assistant", "content": "你好！"},
        {"role": "user", "content": "介绍一下 vLLM"},
    ]
    text = t.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<s>你是一个助手。\nUser: 你好\nAssistant: 你好！</s>User: 介绍一下 vLLM\nAssistant: "
    )
    ids = t.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    assert ids[0] == 1 and ids.count(1) == 1 and ids.count(2) == 1  # markers as special tokens


def test_a_folder_with_a_tokenizer_is_not_started_with_skip_tokenizer_init(tmp_path):
    point = {"point_id": "a-r0", "workload": {"kind": "fixed"}}
    assert has_tokenizer(ERNIE_03B)
    kw = Point.from_dict({**point, "model": "ernie-4.5-0.3b-pt"}).engine_kwargs()
    assert "skip_tokenizer_init" not in kw and kw["load_format"] == "dummy"
    bare = tmp_path / "config-only"
    bare.mkdir()
    shutil.copy(ERNIE_03B / "config.json", bare)
    kw = Point.from_dict({**point, "model": str(bare)}).engine_kwargs()
    assert kw["skip_tokenizer_init"] is True


def test_script_reaches_the_size_exactly_when_the_corpus_runs_short(script):
    # Two words give a handful of merges: the rest of the ids become reserved special tokens.
    tok = script.train(1000, ["<pad>", "<s>", "</s>", "<unk>"], iter(["abc abd"] * 3))
    assert tok.get_vocab_size() == 1000
    assert tok.id_to_token(999) == "<reserved_999>"
    assert tok.decode(tok.encode("abc 中文").ids) == "abc 中文"


def test_script_places_specials_at_configs_ids(script):
    assert script.special_tokens(CONFIG) == ["<pad>", "<s>", "</s>", "<unk>"]
    assert script.special_tokens({"bos_token_id": 0, "eos_token_id": 1}) == [
        "<s>",
        "</s>",
        "<unk>",
        "<pad>",
    ]
    with pytest.raises(SystemExit, match="distinct ids 0..3"):
        script.special_tokens({"bos_token_id": 1, "eos_token_id": 151643})
    with pytest.raises(SystemExit, match="distinct ids 0..3"):
        script.special_tokens({"bos_token_id": 1, "eos_token_id": 1})


@pytest.mark.slow
def test_script_is_reproducible_across_processes(tmp_path):
    """Same files from two processes with different hash seeds and thread counts (small run)."""
    digests = []
    for i, (hash_seed, threads) in enumerate((("1", "1"), ("2", "2"))):
        out = tmp_path / str(i)
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "RAYON_NUM_THREADS": threads}
        args = ["--out", str(out), "--vocab-size", "3000", "--scale", "0.02"]
        subprocess.run([sys.executable, str(SCRIPT), *args], env=env, check=True, timeout=300)
        assert Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size() == 3000
        digests.append(
            [hashlib.sha256((out / f).read_bytes()).hexdigest() for f in sorted(os.listdir(out))]
        )
    assert digests[0] == digests[1]
