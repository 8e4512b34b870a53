"""The locally trained tokenizers (ERNIE-4.5-0.3B's; Qwen3-0.6B's, Llama-3.2-1B's and their tiny
variants', special ids after the ordinary vocabulary), and the script that makes them (no engine)."""

from __future__ import annotations

import functools
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


# --------------------------------------------------------------------------- the high layout
# Qwen3 and Llama 3 place their special tokens after the ordinary vocabulary; the script does the
# same for their folders (and for their tiny variants, with the ids remapped under 1024).
MODELS = Path(__file__).resolve().parents[2] / "models"
HIGH = {
    # folder: (first special id, {id: token}, bos, eos, pad)
    "qwen3-0.6b": (
        151643,
        {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"},
        "<|endoftext|>",
        "<|im_end|>",
        "<|endoftext|>",
    ),
    "llama-3.2-1b": (
        128000,
        {
            128000: "<|begin_of_text|>",
            128001: "<|end_of_text|>",
            128002: "<|reserved_special_token_0|>",
            128006: "<|start_header_id|>",
            128007: "<|end_header_id|>",
            128009: "<|eot_id|>",
            128255: "<|reserved_special_token_250|>",
        },
        "<|begin_of_text|>",
        "<|end_of_text|>",
        None,
    ),
    "tiny-qwen3": (
        1000,
        {1000: "<|endoftext|>", 1002: "<|im_end|>"},
        "<|endoftext|>",
        "<|im_end|>",
        "<|endoftext|>",
    ),
    "tiny-llama": (
        1000,
        {1000: "<|begin_of_text|>", 1009: "<|eot_id|>"},
        "<|begin_of_text|>",
        "<|end_of_text|>",
        None,
    ),
}


@functools.cache
def _high(name):
    folder = MODELS / name
    config = json.loads((folder / "config.json").read_text())
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    return config, tok, tok_config


@pytest.mark.parametrize("name", list(HIGH))
def test_high_layout_vocabulary_is_the_models_and_specials_sit_at_its_ids(name):
    config, tok, tok_config = _high(name)
    first, named, bos, eos, pad = HIGH[name]
    assert tok.get_vocab_size() == config["vocab_size"]
    assert sorted(tok.get_vocab().values()) == list(range(config["vocab_size"]))
    for i, token in named.items():
        assert tok.id_to_token(i) == token
    assert tok.token_to_id(tok_config["bos_token"]) == config["bos_token_id"]
    assert tok.token_to_id(tok_config["eos_token"]) == config["eos_token_id"]
    assert (tok_config["bos_token"], tok_config["eos_token"], tok_config.get("pad_token")) == (
        bos,
        eos,
        pad,
    )
    assert "unk_token" not in tok_config  # byte-level: nothing is unknown
    # the ordinary vocabulary fills every id below the first special one; specials fill the rest
    specials = {t.content for t in tok.get_added_tokens_decoder().values()}
    assert len(specials) == config["vocab_size"] - first
    assert all(tok.id_to_token(i) not in specials for i in range(first))
    assert tok.encode("hello").ids == tok.encode("hello", add_special_tokens=False).ids


@pytest.mark.parametrize("name", list(HIGH))
@pytest.mark.parametrize("text", TEXTS)
def test_high_layout_text_round_trips_without_special_ids(name, text):
    _, tok, _ = _high(name)
    ids = tok.encode(text).ids
    assert max(ids) < HIGH[name][0]  # ordinary text never becomes a special token
    assert tok.decode(ids) == text


@pytest.mark.slow
@pytest.mark.parametrize("name", list(HIGH))
def test_transformers_renders_the_familys_chat_template(monkeypatch, name):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    config, _, _ = _high(name)
    t = AutoTokenizer.from_pretrained(str(MODELS / name), local_files_only=True)
    assert len(t) == config["vocab_size"]
    assert (t.bos_token_id, t.eos_token_id) == (config["bos_token_id"], config["eos_token_id"])
    messages = [
        {"role": "system", "content": "你是一个助手。"},
        {"role": "user", "content": "你好"},
        {"role": "assistant", "content": "你好！"},
    ]
    text = t.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if config["model_type"] == "qwen3":
        assert text == (
            "<|im_start|>system\n你是一个助手。<|im_end|>\n<|im_start|>user\n你好<|im_end|>\n"
            "<|im_start|>assistant\n你好！<|im_end|>\n<|im_start|>assistant\n"
        )
    else:
        assert text == (
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n你是一个助手。<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n你好<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n你好！<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
        )
    ids = t.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    first = HIGH[name][0]
    marker = first + 1 if config["model_type"] == "qwen3" else first + 6  # im_start / header
    assert ids.count(marker) == 4  # every marker one special token, none split into bytes


def test_script_high_layout_specials(script):
    qwen = {"model_type": "qwen3", "bos_token_id": 151643, "eos_token_id": 151645}
    first, specials = script.high_specials(qwen, 151936)
    assert first == 151643 and len(specials) == 293
    assert specials[:4] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<reserved_151646>"]
    assert specials[-1] == "<reserved_151935>"
    llama = {"model_type": "llama", "bos_token_id": 128000, "eos_token_id": 128001}
    first, specials = script.high_specials(llama, 128256)
    assert first == 128000 and len(specials) == 256 and specials[9] == "<|eot_id|>"
    assert specials[2] == "<|reserved_special_token_0|>"
    # another family: generic names at config.json's ids, reserved tokens around them
    other = {"model_type": "mistral", "bos_token_id": 500, "eos_token_id": 502, "pad_token_id": 503}
    first, specials = script.high_specials(other, 505)
    assert specials == ["<s>", "<reserved_501>", "</s>", "<pad>", "<reserved_504>"]
    cfg = script.high_tokenizer_config(other, first, specials)
    assert (cfg["bos_token"], cfg["eos_token"], cfg["pad_token"]) == ("<s>", "</s>", "<pad>")
    assert cfg["chat_template"] == script.CHAT_TEMPLATE  # ERNIE's shape where no family has one
    # a family whose named tokens do not fit above the first id falls back to generic names
    first, specials = script.high_specials(
        {**llama, "bos_token_id": 1020, "eos_token_id": 1021}, 1024
    )
    assert specials == ["<s>", "</s>", "<reserved_1022>", "<reserved_1023>"]


def test_script_chooses_the_layout_from_the_special_ids(script):
    assert not script.is_high_layout(CONFIG)  # ERNIE: ids 0..2
    assert script.is_high_layout({"bos_token_id": 151643, "eos_token_id": 151645})
    assert script.is_high_layout({"bos_token_id": 128000, "eos_token_id": [128001, 128009]})
    assert not script.is_high_layout({"bos_token_id": 1, "eos_token_id": 151643})  # a mix: refused
    with pytest.raises(SystemExit, match="outside vocab"):
        script.high_specials({"bos_token_id": 2000, "eos_token_id": 2001}, 1024)
    with pytest.raises(SystemExit, match="not a token id"):
        script.is_high_layout({"bos_token_id": "151643"})


@pytest.mark.slow
def test_script_high_layout_is_reproducible_across_processes(tmp_path):
    """A Qwen3-shaped folder of 3,000 ids with its specials at 2,990..: same files twice."""
    model = tmp_path / "qwen3-small"
    model.mkdir()
    config = {"model_type": "qwen3", "vocab_size": 3000, "bos_token_id": 2990, "eos_token_id": 2992}
    (model / "config.json").write_text(json.dumps(config))
    digests = []
    for i, (hash_seed, threads) in enumerate((("1", "1"), ("2", "2"))):
        out = tmp_path / str(i)
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "RAYON_NUM_THREADS": threads}
        args = ["--model", str(model), "--out", str(out), "--scale", "0.02"]
        subprocess.run([sys.executable, str(SCRIPT), *args], env=env, check=True, timeout=300)
        tok = Tokenizer.from_file(str(out / "tokenizer.json"))
        assert tok.get_vocab_size() == 3000 and tok.id_to_token(2992) == "<|im_end|>"
        digests.append(
            [hashlib.sha256((out / f).read_bytes()).hexdigest() for f in sorted(os.listdir(out))]
        )
    assert digests[0] == digests[1]


@pytest.mark.slow
def test_script_remakes_the_tiny_qwen3_tokenizer_byte_for_byte(tmp_path):
    folder = MODELS / "tiny-qwen3"
    args = ["--model", str(folder), "--out", str(tmp_path)]
    subprocess.run([sys.executable, str(SCRIPT), *args], check=True, timeout=300)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / f).read_bytes() == (folder / f).read_bytes()
