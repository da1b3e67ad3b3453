"""`mf-train generate`: greedy tokens equal the argmax of a numpy Qwen3's full forward, the
key/value cache (and DeepSeek-V3's compressed one) changes no token, sampling keeps to its
top-k / top-p set, an mf checkpoint and its Hugging Face export continue a prompt alike, and
bad input is one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from mindspore import Tensor
from runs import DEEPSEEK, DEEPSEEK_3_LAYERS, QWEN3, QWEN3_2_LAYERS
from test_qwen3 import loaded_model, np_logits

from mf_train.export.generation import GenerateError, Sampling, choose, generate, load_model
from mf_train.launch.cli import run
from mf_train.models.kv_cache import KVCache

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def numpy_greedy(weights: dict, extras: dict, prompt: list[int], count: int) -> list[int]:
    """The reference: each token the argmax of the numpy model's last logits over the whole
    sequence so far (float64, no cache)."""
    ids = list(prompt)
    for _ in range(count):
        ids.append(int(np.argmax(np_logits(weights, extras, np.asarray([ids]))[0, -1])))
    return ids[len(prompt):]


def test_greedy_tokens_are_the_numpy_models_with_and_without_the_cache() -> None:
    model, weights, extras = loaded_model()
    want = numpy_greedy(weights, extras, PROMPT, 24)
    assert generate(model, PROMPT, 24) == want
    assert generate(model, PROMPT, 24, use_cache=False) == want


def test_sampled_tokens_are_the_same_with_and_without_the_cache() -> None:
    model, _, _ = loaded_model()
    sampling = Sampling(temperature=1.5, top_k=8, top_p=0.95, seed=3)
    cached = generate(model, PROMPT, 16, sampling)
    assert cached == generate(model, PROMPT, 16, sampling, use_cache=False)
    assert cached != generate(model, PROMPT, 16, Sampling(1.5, 8, 0.95, seed=4))


def test_sampling_keeps_to_the_top_k_and_top_p_tokens() -> None:
    logits = np.log(np.array([0.05, 0.4, 0.3, 0.2, 0.05]))
    rng = np.random.default_rng(0)
    drawn = {choose(logits, Sampling(1.0, top_k=2), rng) for _ in range(200)}
    assert drawn == {1, 2}
    drawn = {choose(logits, Sampling(1.0, top_p=0.8), rng) for _ in range(200)}
    assert drawn == {1, 2, 3}  # 0.4 + 0.3 < 0.8 <= 0.4 + 0.3 + 0.2
    assert choose(logits, Sampling(), rng) == 1


def test_generation_stops_at_the_end_of_document() -> None:
    model, _, _ = loaded_model()
    tokens = generate(model, PROMPT, 12)
    assert generate(model, PROMPT, 12, eod=tokens[3]) == tokens[:tokens.index(tokens[3])]


def test_a_checkpoint_and_its_export_continue_alike(runs, tmp_path, capsys) -> None:
    """The CLI on an mf checkpoint, the library on it and on its Hugging Face export."""
    checkpoint = runs(QWEN3, *QWEN3_2_LAYERS) / "ckpt"
    assert run(["generate", "--checkpoint", str(checkpoint), "--prompt-ids", "1,2,3",
                "--max-new-tokens", "20"]) == 0
    printed = [int(i) for i in capsys.readouterr().out.split()]
    assert len(printed) <= 20 and printed == generate(load_model(checkpoint), [1, 2, 3], 20,
                                                      eod=256)
    assert run(["export-hf", "--checkpoint", str(checkpoint), "--output",
                str(tmp_path / "hf")]) == 0
    assert generate(load_model(tmp_path / "hf"), [1, 2, 3], 20, eod=256) == printed


def test_a_hugging_face_tokenizer_encodes_and_travels_with_the_export(runs, tmp_path,
                                                                       capsys) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    words = {"[UNK]": 0, "hello": 1, "world": 2, "<|endoftext|>": 3}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    (tmp_path / "tok").mkdir()
    tokenizer.save(str(tmp_path / "tok" / "tokenizer.json"))
    checkpoint = runs(QWEN3, *QWEN3_2_LAYERS) / "ckpt"
    assert run(["generate", "--checkpoint", str(checkpoint), "--tokenizer",
                str(tmp_path / "tok"), "--prompt", "hello world", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.startswith("hello world")
    assert run(["export-hf", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "hf"),
                "--tokenizer", str(tmp_path / "tok")]) == 0
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == \
        (tmp_path / "tok" / "tokenizer.json").read_bytes()
    assert run(["export-hf", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "x"),
                "--tokenizer", str(tmp_path)]) == 2
    assert "no tokenizer.json or tokenizer_config.json there" in capsys.readouterr().err


def test_deepseek_v3_decodes_with_the_compressed_cache(runs) -> None:
    """MLA's cache (latent and rope key per position) gives the whole sequence's logits, fed
    in three pieces; greedy tokens are the same with and without it."""
    model = load_model(runs(DEEPSEEK, *DEEPSEEK_3_LAYERS) / "ckpt")
    ids = np.random.default_rng(2).integers(0, 512, (2, 12)).astype(np.int32)
    whole = model.logits(Tensor(ids)).asnumpy()
    cache = KVCache()
    pieces = [model.decode(Tensor(ids[:, a:b]), cache).asnumpy()
              for a, b in ((0, 7), (7, 8), (8, 12))]
    np.testing.assert_allclose(np.concatenate(pieces, 1), whole, rtol=0, atol=1e-5)
    assert generate(model, PROMPT, 8) == generate(model, PROMPT, 8, use_cache=False)


@pytest.mark.parametrize(("args", "says"), [
    (["--prompt-ids", "1 2 x"], "--prompt-ids '1 2 x': give integers"),
    (["--prompt-ids", "1 999"], "prompt id 999 is outside the model's vocabulary (0..511)"),
    (["--prompt-ids", "1 2", "--max-new-tokens", "40"], "need 42 positions; the model takes 32"),
    (["--prompt", "hi", "--tokenizer", "/nonexistent/tokenizer.json"], "/nonexistent"),
    (["--prompt", "hi", "--top-p", "0"], "--top-p must be in (0, 1]"),
])
def test_bad_input_is_one_line(runs, capsys, args: list[str], says: str) -> None:
    checkpoint = runs(QWEN3, *QWEN3_2_LAYERS) / "ckpt"
    assert run(["generate", "--checkpoint", str(checkpoint), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err


def test_a_directory_without_a_model_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(GenerateError, match="holds neither a complete mf checkpoint"):
        load_model(tmp_path)
