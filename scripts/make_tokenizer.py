"""Train a byte-level BPE tokenizer with a model's exact vocabulary size, locally and reproducibly.

For a model folder that holds only config.json (dummy weights) and whose real tokenizer cannot be
downloaded. With a tokenizer vLLM tokenizes and detokenizes on the host, as it does in production;
without one, tunebook must start it with ``skip_tokenizer_init`` and that host work is never
measured. The vocabulary has the model's size and its special ids (so every id the model can emit
decodes), but it is learned from a synthetic corpus built here from a fixed seed: token statistics
(characters per token, which words are whole tokens) are not the real tokenizer's.

Two layouts, chosen by config.json's pad/bos/eos ids; byte-level either way, so any text
round-trips:

- **low** (ERNIE, models/tiny-ernie): ``<pad> <s> </s> <unk>`` at ids 0..3 (placed at config.json's
  pad/bos/eos ids), the 256 byte symbols, then merges.
- **high** (Qwen3, Llama 3: special ids after the ordinary vocabulary): the 256 byte symbols and
  merges at ids 0 .. first-1, where ``first`` is the lowest special id; from ``first`` to the end
  of the vocabulary, special tokens: the family's named ones at the offsets its published
  tokenizer has them (``FAMILIES``: Qwen3's ``<|endoftext|> <|im_start|> <|im_end|>``, Llama 3's
  ``<|begin_of_text|> <|end_of_text|>`` and chat headers), config.json's roles at their ids, and
  reserved ones in between, so every id the model can emit decodes. The family's chat template
  (ChatML for Qwen3, Llama 3's headers); a model_type without one gets ERNIE's.

    python scripts/make_tokenizer.py                                # models/ernie-4.5-0.3b-pt
    python scripts/make_tokenizer.py --model <folder or name under models/> [--out DIR]
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = "ernie-4.5-0.3b-pt"
SEED = 20250630
# Special tokens by role. <unk> takes the one low id config.json does not name; byte-level BPE
# never emits it, but tokenizers' BPE model wants an unk token and the tiny model has one.
ROLES = {"pad_token_id": "<pad>", "bos_token_id": "<s>", "eos_token_id": "</s>"}
UNK = "<unk>"
# One token at most 16 byte symbols (a 5-character Chinese word, a long English word): the tail
# of a synthetic corpus would otherwise fill the vocabulary with whole phrases.
MAX_TOKEN_LENGTH = 16
# ERNIE-4.5's chat shape ("User: ...\nAssistant: ...", begin / end of sentence markers) with this
# vocabulary's markers, so chat prompts have the length and structure ERNIE's would.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n"
    "{% elif m['role'] == 'user' %}User: {{ m['content'] }}\n"
    "{% elif m['role'] == 'assistant' %}Assistant: {{ m['content'] }}{{ eos_token }}"
    "{% else %}{{ m['role'] }}: {{ m['content'] }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant: {% endif %}"
)

# The high layout: special ids from here up leave room for the 256 byte symbols and a merge.
MIN_HIGH_ID = 257
QWEN3_CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# By model_type: the published tokenizer's special tokens by offset from the first special id,
# the name of its reserved ones ({k}: their count so far), its chat template, and its pad token
# where config.json names none.
FAMILIES = {
    "qwen3": {
        "names": {0: "<|endoftext|>", 1: "<|im_start|>", 2: "<|im_end|>"},
        "reserved": None,  # <reserved_ID>, as train() names its own
        "chat_template": QWEN3_CHAT_TEMPLATE,
        "pad": 0,
    },
    "llama": {
        "names": {
            0: "<|begin_of_text|>",
            1: "<|end_of_text|>",
            6: "<|start_header_id|>",
            7: "<|end_header_id|>",
            9: "<|eot_id|>",
        },
        "reserved": "<|reserved_special_token_{k}|>",
        "chat_template": LLAMA3_CHAT_TEMPLATE,
        "pad": None,
    },
}

# ---------------------------------------------------------------------------------- the corpus
# Hand-written text (the project's own words, not copied from elsewhere): the top of the Zipf
# ranks, so the vocabulary of the workbook's subject gets whole tokens, as a real one would.
ZH_TEXT = """\
大模型部署到生产环境以后，最先遇到的问题往往是内存不够用、速度不够快。
推理框架把请求打包成批次，在同一个步骤里同时处理多个序列，从而提高显卡的利用率。
每生成一个新词元，模型都要读取之前所有词元的键和值，这就是所谓的键值缓存。
缓存按块管理，块的大小决定了前缀复用的粒度，也影响内存碎片的多少。
预填充阶段一次处理整段提示词，计算量随长度增长；解码阶段每步只生成一个词元，更受带宽和主机开销限制。
调优之前先测量：同一个配置在不同的启动之间也会有明显的波动，所以要重复多次，比较中位数和范围。
首字延迟、每个词元的时间、端到端延迟和吞吐量，是判断配置好坏的主要指标。
如果服务水平目标要求首字延迟低于五百毫秒，那么吞吐量只计算满足目标的请求。
文本先被分词器切成词元，模型输出的词元再被还原成文字，这些工作都在主机上完成。
中文、英文、数字和标点符号都应该能被准确地编码和解码，不能丢失任何一个字节。
我们在一张显卡上运行了完整的实验，并把每一个结果和它的运行目录一起保存下来。
这个结论并不正确：处理时间随提示词长度按多项式增长，而不是指数增长。
请用简单的语言解释一下什么是分页注意力，以及它为什么能减少内存浪费。
今天的天气很好，我们一起去公园散步，然后在附近的小饭馆吃午饭。
学习一门新的技术，最好的办法是动手实践，遇到问题再去查阅文档。
"""

EN_TEXT = """\
tunebook is a Jupyter tuning workbook for vLLM. It answers deployment questions for one model
from measurements on real engines, and tests the claims of a popular tuning article with numbers.
Every notebook states its question, method and expected outcome first, takes its parameters from
one cell, and ends with verdicts on the claims it owns. The KV cache holds the keys and values of
every token; its capacity follows from the model's shape, the block size and the memory left after
the weights. Configurations are ranked only with interleaved repeats over several engine starts,
reported as median and range; a gap whose ranges overlap is called within the noise. The time to
first token grows with the prompt length, and the time per output token with the batch. The server
listens on all interfaces; add a host address to keep it on this machine, and an API key to
require one. What is the capital of France? Please summarise the following document in three
sentences. Write a short poem about the sea. Explain the difference between a process and a
thread. The quick brown fox jumps over the lazy dog. Thank you, that was very helpful!
"""

# Frequent characters and words, roughly in order of frequency (from general knowledge of the
# languages, not copied from a list): they take the top ranks, so common text tokenizes as it
# would with a real vocabulary (whole words where a real one has them).
ZH_CHARS = (
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学"
    "对可里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面"
    "公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情"
    "部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北"
    "少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神"
    "数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台"
    "象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思"
    "非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完"
    "革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持音送罗存储"
)
ZH_WORDS = (
    "我们 他们 你们 一个 没有 这个 什么 中国 自己 知道 可以 现在 时候 因为 所以 如果 但是 问题 "
    "工作 发展 进行 已经 开始 需要 使用 模型 数据 性能 内存 部署 服务 请求 用户 系统 方法 结果 "
    "时间 一些 这些 那些 还是 或者 就是 不是 只是 然后 其实 通过 根据 关于 对于 以及 所有 每个 "
    "之后 之前 以后 以前 今天 明天 昨天 朋友 学生 老师 公司 社会 经济 文化 历史 世界 国家 政府 "
    "人民 生活 学习 研究 技术 科学 计算 机器 智能 人工 语言 文字 信息 网络 软件 硬件 显卡 显存 "
    "缓存 配置 参数 设置 测试 测量 实验 分析 比较 选择 优化 调优 提高 降低 增加 减少 影响 效果 "
    "速度 延迟 吞吐 批次 并发 长度 大小 数量 内容 文本 文章 翻译 介绍 解释 说明 总结 回答 问答 "
    "对话 生成 推理 训练 框架 引擎 版本 环境 保护 天气 交通 情况 简单 重要 主要 不同 相同 一样 "
    "非常 特别 比较 可能 应该 必须 能够 希望 觉得 认为 发现 看到 听到 告诉 提供 支持 包括 表示 "
    "出现 成为 进入 得到 完成 实现 解决 处理 管理 控制 运行 启动 停止 错误 失败 成功 正确 准确"
)
EN_WORDS = (
    "the of and to a in is it you that he was for on are with as i his they be at one have this from "
    "or had by not word but what some we can out other were all there when up use your how said an "
    "each she which do their time if will way about many then them write would like so these her "
    "long make thing see him two has look more day could go come did number sound no most people my "
    "over know water than call first who may down side been now find any new work part take get "
    "place made live where after back little only round man year came show every good me give our "
    "under name very through just form sentence great think say help low line differ turn cause "
    "much mean before move right boy old too same tell does set three want air well also play small "
    "end put home read hand port large spell add even land here must big high such follow act why "
    "ask men change went light kind off need house picture try us again animal point mother world "
    "near build self earth father head stand own page should country found answer school grow study "
    "still learn plant cover food sun four between state keep eye never last let thought city tree "
    "cross farm hard start might story saw far sea draw left late run while press close night real "
    "life few north open seem together next white children begin got walk example ease paper group "
    "always music those both mark often letter until mile river car feet care second book carry "
    "took science eat room friend began idea fish mountain stop once base hear horse cut sure watch "
    "color face wood main enough plain girl usual young ready above ever red list though feel talk "
    "bird soon body dog family direct pose leave song measure door product black short numeral class "
    "wind question happen complete ship area half rock order fire south problem piece told knew pass "
    "since top whole king space heard best hour better true during hundred five remember step early "
    "hold west ground interest reach fast verb sing listen six table travel less morning ten simple "
    "several toward war lay against pattern slow center love person money serve appear road map rain "
    "rule govern pull cold notice voice unit power town fine certain fly fall lead cry dark machine "
    "note wait plan figure star box noun field rest correct able pound done beauty drive stood "
    "contain front teach week final gave green quick develop ocean warm free minute strong special "
    "mind behind clear tail produce fact street inch multiply nothing course stay wheel full force "
    "blue object decide surface deep moon island foot system busy test record boat common gold "
    "possible plane instead dry wonder laugh thousand ago ran check game shape equal hot miss brought "
    "heat snow tire bring yes distant fill east paint language among model memory server request "
    "response token cache batch latency throughput engine default configuration setting value "
    "result data file user client input output prompt length size block prefix decode prefill "
    "sequence attention layer weight parameter benchmark measure percent median range noise "
    "deployment python install version error warning function return import class string list"
)

# The shapes of code and configuration lines: indentation, brackets, operators.
CODE_LINES = (
    "def {a}({b}, {c}=None):",
    "    return {a}.{b}({c}, {n})",
    "    if {a} is not None and {b} > {n}:",
    "        {a}[{n}] = {b}.get('{c}', {n})",
    "for {a} in range({n}):",
    "{a} = {{'{b}': {n}, '{c}': [{n}, {n}]}}",
    "import {a}\nfrom {b} import {c}",
    "# {a} {b} {c}",
    "{a}: {n}\n  {b}: {c}",
    "vllm serve {a} --max-num-seqs {n} --block-size {n}",
    "$ python -m {a}.{b} --{c} {n}",
    '{{"{a}": {n}, "{b}": "{c}"}}',
    "<{a}>{b}</{a}>",
    "https://{a}.{b}/{c}/{n}",
)

# Empty onsets and codas twice: vowel-initial and open syllables are common.
ONSETS = ("", "") + tuple(
    "b c d f g h j k l m n p qu r s t v w y z bl br ch cl cr dr fl fr gl gr ph pl pr sc sh sk sl "
    "sm sn sp st str sw th tr wh".split()
)
NUCLEI = tuple("a e i o u a e i o ai ea ee ie io oo ou y".split())
CODAS = ("", "", "") + tuple(
    "n r s t l m d nd ng nt rd st ck x ss ll tion ment ing ed er ly".split()
)
ZH_PUNCT = "，，，。。、；：？！"
EN_PUNCT = (",", ",", ".", ".", ";", ":", "?", "!", " -", "'s")
CJK = range(0x4E00, 0xA000)  # CJK Unified Ideographs: 20,992 characters


def zipf(n: int, rng: random.Random, s: float = 1.0) -> Callable[[], int]:
    """A sampler of ranks 0..n-1 with weight 1/(rank+1)^s.

    Only ``rng.random()`` is used: its sequence for a given seed is what Python promises to keep
    across versions (choices() and shuffle() are not promised), so the corpus is reproducible.
    """
    cum, t = [], 0.0
    for r in range(n):
        t += 1.0 / (r + 1) ** s
        cum.append(t)
    return lambda: min(bisect.bisect(cum, rng.random() * t), n - 1)


def pick(seq, rng: random.Random):
    return seq[int(rng.random() * len(seq))]


def permuted(seq, rng: random.Random) -> list:
    """Fisher-Yates on ``rng.random()`` (reproducible, unlike random.shuffle's promise)."""
    out = list(seq)
    for i in range(len(out) - 1, 0, -1):
        j = int(rng.random() * (i + 1))
        out[i], out[j] = out[j], out[i]
    return out


def en_lexicon(rng: random.Random, size: int) -> list[str]:
    """Real words (EN_WORDS, EN_TEXT) first, then invented syllable words, shorter ones first."""
    seen: dict[str, None] = dict.fromkeys(EN_WORDS.split())
    for w in EN_TEXT.replace("\n", " ").split():
        w = w.strip(".,?!;:'").lower()
        if w.isalpha():
            seen.setdefault(w)
    invented: dict[str, int] = {}
    while len(invented) < size - len(seen):
        u = rng.random()
        k = 1 if u < 0.3 else 2 if u < 0.7 else 3 if u < 0.92 else 4  # syllables
        w = "".join(pick(ONSETS, rng) + pick(NUCLEI, rng) + pick(CODAS, rng) for _ in range(k))
        if w not in seen and w not in invented:
            invented[w] = len(w)
    return list(seen) + sorted(invented, key=invented.__getitem__)  # stable: ties keep their order


def zh_ranked_chars(rng: random.Random) -> list[str]:
    """Every CJK ideograph: ZH_CHARS and those of ZH_TEXT first, the rest in a seeded order."""
    first = list(dict.fromkeys(c for c in ZH_CHARS + ZH_WORDS + ZH_TEXT if ord(c) in CJK))
    known = set(first)
    rest = permuted([chr(c) for c in CJK if chr(c) not in known], rng)
    return first + rest


def zh_lexicon(rng: random.Random, chars: list[str], size: int) -> list[str]:
    """ZH_WORDS, then words of 2-4 characters (mostly 2) drawn from Zipf-ranked characters."""
    char = zipf(len(chars), rng, 1.05)
    words: dict[str, None] = dict.fromkeys(ZH_WORDS.split())
    while len(words) < size:
        u = rng.random()
        k = 2 if u < 0.7 else 3 if u < 0.9 else 4
        words.setdefault("".join(chars[char()] for _ in range(k)))
    return list(words)


def number(rng: random.Random) -> str:
    u = rng.random()
    if u < 0.5:
        return str(int(10 ** (rng.random() * 4)))
    if u < 0.75:
        return f"{rng.random() * 100:.{1 + int(rng.random() * 3)}f}"
    if u < 0.9:
        return f"{int(rng.random() * 100)}%"
    return f"{int(rng.random() * 4)}.{int(rng.random() * 40)}.{int(rng.random() * 10)}"


def corpus(seed: int = SEED, scale: float = 1.0) -> Iterator[str]:
    """The training text, line by line: the same lines for the same seed and scale.

    Chinese and English sentences from Zipf-distributed lexicons (so frequent words become whole
    tokens and rare ones stay split), mixed-language lines, numbers, code-shaped lines, the
    hand-written paragraphs, and every CJK ideograph on its own line a few times, so each becomes
    one token (Chinese text the corpus never saw still costs one token a character, not three).
    """
    rng = random.Random(seed)
    chars = zh_ranked_chars(rng)
    en = en_lexicon(rng, 60_000)
    zh = zh_lexicon(rng, chars, 45_000)
    en_w, zh_w, zh_c = zipf(len(en), rng), zipf(len(zh), rng), zipf(len(chars), rng, 1.05)

    def en_sentence() -> str:
        ws = [en[en_w()] for _ in range(4 + int(rng.random() * 14))]
        if rng.random() < 0.15:
            ws[int(rng.random() * len(ws))] = number(rng)
        ws[0] = ws[0].capitalize()
        return " ".join(ws) + pick(EN_PUNCT[2:4], rng)

    def zh_clause() -> str:
        parts = []
        for _ in range(2 + int(rng.random() * 6)):
            u = rng.random()
            if u < 0.62:
                parts.append(zh[zh_w()])
            elif u < 0.96:
                parts.append(chars[zh_c()])
            elif u < 0.98:
                parts.append(number(rng))
            else:
                parts.append(en[en_w()])  # Latin words inside Chinese text (vLLM部署)
        return "".join(parts)

    for _ in range(10):
        yield ZH_TEXT
        yield EN_TEXT
    n = int(60_000 * scale)
    for i in range(n):
        u = rng.random()
        if u < 0.45:
            k = 1 + int(rng.random() * 4)
            yield "".join(zh_clause() + pick(ZH_PUNCT, rng) for _ in range(k))
        elif u < 0.85:
            yield " ".join(en_sentence() for _ in range(1 + int(rng.random() * 3)))
        elif u < 0.93:
            a, b, c = (en[en_w()] for _ in range(3))
            yield pick(CODE_LINES, rng).format(a=a, b=b, c=c, n=number(rng))
        else:
            yield zh_clause() + " " + en_sentence() + " " + zh_clause() + "。"
        if i % 3000 == 0:  # whitespace runs: indentation and blank lines
            yield "\n".join(" " * k + "x" for k in range(1, 17)) + "\n\n\n\t\t\n"
    for _ in range(max(1, int(6 * scale))):
        yield "\n".join(chars)


# ---------------------------------------------------------------------------------- training
def special_tokens(config: dict) -> list[str]:
    """The special tokens in id order 0..3, each role at the id config.json gives it."""
    ids = {role: config.get(role) for role in ROLES}
    given = {i: ROLES[r] for r, i in ids.items() if i is not None}
    bad = any(not isinstance(i, int) or not 0 <= i < 4 for i in given)
    if bad or len(given) != sum(i is not None for i in ids.values()):
        raise SystemExit(
            f"special ids {ids} in config.json: this script places <pad> <s> </s> <unk> at "
            "distinct ids 0..3 (ERNIE's and the tiny model's layout), or every special id at "
            f"{MIN_HIGH_ID} or above, after the bytes and merges (Qwen3's and Llama's); a mix of "
            "the two is not supported"
        )
    fill = iter([UNK] + [ROLES[r] for r in ROLES if ids[r] is None])
    return [given[i] if i in given else next(fill) for i in range(4)]


def train(vocab_size: int, specials: list[str], lines: Iterator[str]) -> Tokenizer:
    """A byte-level BPE tokenizer with exactly ``vocab_size`` tokens (ids 0..vocab_size-1)."""
    tok = Tokenizer(models.BPE(unk_token=UNK if UNK in specials else None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[AddedToken(s, special=True, normalized=False) for s in specials],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        max_token_length=MAX_TOKEN_LENGTH,
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer)
    short = vocab_size - tok.get_vocab_size()
    if short > 0:
        # The trainer stops when no pair is left to merge (a corpus too small for the size). The
        # model's ids must all decode, so the rest are reserved special tokens, as real
        # tokenizers reserve theirs; with the built-in corpus at its full scale this never runs.
        first = tok.get_vocab_size()
        tok.add_special_tokens([f"<reserved_{first + i}>" for i in range(short)])
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"vocabulary {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    return tok


def tokenizer_config(config: dict, specials: list[str]) -> dict:
    """tokenizer_config.json: the tiny model's keys, the chat template, no space clean-up."""
    roles = {v: k for k, v in ROLES.items()}
    by_role = {roles[s].replace("_id", ""): s for s in specials if s in roles}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **{k: by_role[k] for k in ("bos_token", "eos_token", "pad_token") if k in by_role},
        "unk_token": UNK,
        "model_max_length": int(config.get("max_position_embeddings", 4096)),
        # Byte-level decoding is exact; transformers' clean-up would turn " ." into "." and
        # break the round trip.
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def role_ids(config: dict) -> dict[str, list[int]]:
    """config.json's special ids by role (eos may be a list), the roles it names."""
    out = {}
    for role in ROLES:
        v = config.get(role)
        if v is None:
            continue
        ids = v if isinstance(v, list) else [v]
        if not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise SystemExit(f"{role} {v!r} in config.json: not a token id")
        out[role] = ids
    return out


def is_high_layout(config: dict) -> bool:
    """Every special id config.json names lies at MIN_HIGH_ID or above (Qwen3, Llama 3)."""
    ids = [i for v in role_ids(config).values() for i in v]
    return bool(ids) and min(ids) >= MIN_HIGH_ID


def high_specials(config: dict, vocab_size: int) -> tuple[int, list[str]]:
    """The high layout: the first special id, and the special tokens of ids first..vocab_size-1."""
    roles = role_ids(config)
    ids = sorted({i for v in roles.values() for i in v})
    if ids[-1] >= vocab_size:
        raise SystemExit(f"special id {ids[-1]} in config.json lies outside vocab {vocab_size}")
    first = ids[0]
    fam = FAMILIES.get(str(config.get("model_type")), {})
    names = dict(fam.get("names") or {})
    if names and max(names) >= vocab_size - first:
        names = {}  # the family's tokens do not fit above the first special id: generic names
    by_offset = dict(names)
    for role, rids in roles.items():
        for i in rids:
            by_offset.setdefault(i - first, ROLES[role])
    out, k = [], 0
    for off in range(vocab_size - first):
        if off in by_offset:
            out.append(by_offset[off])
            continue
        pattern = fam.get("reserved") if names else None
        out.append(pattern.format(k=k) if pattern else f"<reserved_{first + off}>")
        k += 1
    if len(set(out)) != len(out):
        raise SystemExit(f"special tokens repeat a name: {sorted(set(out))[:8]} ...")
    return first, out


def high_tokenizer_config(config: dict, first: int, specials: list[str]) -> dict:
    """tokenizer_config.json of the high layout: the role tokens at config.json's ids, the
    family's chat template (ERNIE's where the family has none), no unk token (byte-level BPE
    never needs one), no space clean-up."""
    roles = role_ids(config)
    fam = FAMILIES.get(str(config.get("model_type")), {})
    named = bool(fam) and all(
        off < len(specials) and specials[off] == name for off, name in fam["names"].items()
    )
    by_role = {r.replace("_id", ""): specials[ids[0] - first] for r, ids in roles.items()}
    if "pad_token" not in by_role and named and fam.get("pad") is not None:
        by_role["pad_token"] = specials[fam["pad"]]
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **{k: by_role[k] for k in ("bos_token", "eos_token", "pad_token") if k in by_role},
        "model_max_length": int(config.get("max_position_embeddings", 4096)),
        "clean_up_tokenization_spaces": False,
        "chat_template": fam["chat_template"] if named else CHAT_TEMPLATE,
    }


def train_high(config: dict, vocab_size: int, lines: Iterator[str]) -> tuple[Tokenizer, list]:
    """The high layout: bytes and merges up to the first special id, then the special tokens."""
    first, specials = high_specials(config, vocab_size)
    tok = train(first, [], lines)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    placed = [tok.token_to_id(s) for s in specials]
    if placed != list(range(first, vocab_size)) or tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"special tokens landed at {placed[:4]}..., wanted {first}...")
    return tok, specials


def resolve(model: str) -> Path:
    p = Path(model)
    if not (p / "config.json").is_file():
        p = ROOT / "models" / model
    if not (p / "config.json").is_file():
        raise SystemExit(f"no config.json in {model} or models/{model}")
    return p


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=DEFAULT_MODEL, help="model folder, or a name under models/")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default: the model's)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--scale", type=float, default=1.0, help="corpus size factor (tests: small)")
    ap.add_argument("--vocab-size", type=int, default=None, help="override config's (tests)")
    args = ap.parse_args(argv)

    model_dir = resolve(args.model)
    config = json.loads((model_dir / "config.json").read_text())
    vocab_size = args.vocab_size or int(config["vocab_size"])
    high = is_high_layout(config)
    specials = [] if high else special_tokens(config)
    out = args.out or model_dir
    out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    if high:
        tok, specials = train_high(config, vocab_size, corpus(args.seed, args.scale))
        cfg = high_tokenizer_config(config, vocab_size - len(specials), specials)
    else:
        tok = train(vocab_size, specials, corpus(args.seed, args.scale))
        cfg = tokenizer_config(config, specials)
    tok.save(str(out / "tokenizer.json"), pretty=False)  # compact: ~half the pretty size
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")

    vocab = tok.get_vocab()
    one = sum(len(tok.encode(chr(c)).ids) == 1 for c in CJK)
    zh = sum(any(0x4E00 <= ord(ch) < 0xA000 for ch in tok.decode([i])) for i in vocab.values())
    digest = hashlib.sha256((out / "tokenizer.json").read_bytes()).hexdigest()[:16]
    print(
        f"{out}: {tok.get_vocab_size()} tokens (specials {specials[:6]}"
        f"{' ...' if len(specials) > 6 else ''}), "
        f"{zh} with Chinese, {one}/{len(CJK)} CJK ideographs one token each; "
        f"tokenizer.json {(out / 'tokenizer.json').stat().st_size / 1e6:.1f} MB "
        f"sha256 {digest}; {time.perf_counter() - t0:.0f} s",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
