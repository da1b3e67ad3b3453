"""mf_data against goldens recorded from real megatron-core 0.16.1 (no torch or Megatron here).

tests/data/golden/ was written by ``nox -s megatron_parity -- --write``
(tests/data/parity/generate_golden.py): Megatron's own ``.bin``/``.idx`` corpora and, per case
of tests/data/parity/cases.py, the index arrays, cache descriptions and a selection of samples
from Megatron's ``BlendedMegatronDatasetBuilder``. Here mf_data rebuilds every case from those
corpora and must match bit for bit (dtype, shape and value); our builder must also write the
corpora byte for byte as Megatron's builder did.

The cases Megatron refuses (cases.REFUSED: null sizes next to weights) are in the manifest
with Megatron's message; mf_data must refuse them too, at the same ``sizes[i]``.

Megatron's samples were taken from a fresh loss-mask state each (generate_golden.py explains its
stateful loss-mask defect, which mf_data deliberately does not reproduce).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mf_data.indexed import IndexedDataset

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden"
CORPORA = GOLDEN / "corpora"


def _load(name: str) -> Any:
    module_name = f"mf_parity_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, HERE / "parity" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


cases = _load("cases")
ours = _load("ours")
MANIFEST = json.loads((GOLDEN / "manifest.json").read_text())
CASE_NAMES = [case.name for case in cases.CASES]


def test_goldens_cover_every_case_of_the_matrix() -> None:
    assert sorted(MANIFEST["cases"]) == sorted(CASE_NAMES)
    assert MANIFEST["megatron_core"] == "0.16.1"
    for case in cases.CASES:
        # The case as recorded is the case as defined now (tuples read back as lists).
        assert MANIFEST["cases"][case.name] == json.loads(json.dumps(case.as_dict()))


def test_megatron_corpora_are_the_seeded_documents() -> None:
    for name, spec in cases.CORPORA.items():
        corpus = IndexedDataset(CORPORA / name)
        documents = cases.corpus_documents(spec)
        lengths = [length for _, sequence_lengths in documents for length in sequence_lengths]
        assert corpus.sequence_lengths.tolist() == lengths
        assert corpus.dtype == np.dtype(spec.dtype)
        boundaries = np.cumsum([0] + [len(lengths) for _, lengths in documents])
        assert corpus.document_indices.tolist() == boundaries.tolist()
        tokens = np.concatenate([document for document, _ in documents])
        read = np.concatenate([corpus.get(i) for i in range(len(corpus))])
        assert np.array_equal(read.astype(np.int64), tokens)
        assert 1 in lengths  # length-1 sequences are part of the coverage


def test_our_builder_writes_megatrons_bytes(tmp_path: Path) -> None:
    ours.write_corpora(tmp_path)
    for name in cases.CORPORA:
        for suffix in (".bin", ".idx"):
            megatron = (CORPORA / f"{name}{suffix}").read_bytes()
            assert hashlib.sha256(megatron).hexdigest() == \
                MANIFEST["corpora_sha256"][f"{name}{suffix}"]
            assert (tmp_path / f"{name}{suffix}").read_bytes() == megatron, f"{name}{suffix}"


def _golden(name: str) -> dict[str, np.ndarray]:
    with np.load(GOLDEN / f"{name}.npz") as stored:
        return {key: stored[key] for key in stored.files}


@pytest.mark.parametrize("name", CASE_NAMES)
def test_case_matches_megatron(name: str, tmp_path: Path) -> None:
    case = next(case for case in cases.CASES if case.name == name)
    want = _golden(name)
    sample_ids = {split: want[f"{split}/sample_ids"] for split in ours.SPLIT_NAMES
                  if f"{split}/sample_ids" in want}
    got = ours.record_case(case, CORPORA, str(tmp_path / "cache"), None, sample_ids)
    got.update(ours.cache_listing(tmp_path / "cache", "ours"))
    problems = []
    want_arrays, got_arrays = ours.without_cache(want), ours.without_cache(got)
    for key in sorted(set(want_arrays) | set(got_arrays)):
        if key not in got_arrays or key not in want_arrays:
            problems.append(f"{key}: only in {'Megatron' if key in want_arrays else 'ours'}")
            continue
        problems += ours.array_difference(key, want_arrays[key], got_arrays[key])
    # The cache files carry Megatron's names (md5 of the same description) and descriptions.
    problems += ours.cache_differences(name, want, got)
    assert not problems, "\n".join(problems[:20])


REFUSED = {refused.case.name: refused for refused in cases.REFUSED}


def test_refusals_were_megatrons() -> None:
    assert sorted(MANIFEST["refused"]) == sorted(REFUSED)
    for name, recorded in MANIFEST["refused"].items():
        assert recorded["case"] == json.loads(json.dumps(REFUSED[name].case.as_dict()))
        assert recorded["path"] == REFUSED[name].path
        assert recorded["megatron"].startswith("AssertionError: size_is_none => "
                                               "weights_are_none fails for ")


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_ours_refuses_where_megatron_refuses(name: str, tmp_path: Path) -> None:
    refused = REFUSED[name]
    split = MANIFEST["refused"][name]["megatron"].split(" fails for ")[1].split()[0]
    message = ours.refusal(refused.case, CORPORA, str(tmp_path / "cache"))
    assert message is not None, f"{name}: mf_data builds what Megatron refuses"
    assert message.startswith(f"{refused.path}: null (one epoch) is not allowed with weights")
    # The same split as Megatron's assertion names.
    assert f"the number of {split} samples" in message
    assert not (tmp_path / "cache").exists()  # refused before any index is built
