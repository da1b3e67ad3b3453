"""Which rank files `mf-train export-hf` reads, worked out from the plan alone (no run): one per
pipeline stage, expert share and tensor place, each holding its stage's layers and its share
of the routed experts; copies of a weight in two files read must be equal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from runs import DEEPSEEK, QWEN3

from mf_config.validate import config_from_source, load_source
from mf_train.export_ranks import holdings, source_ranks, tensor_places
from mf_train.hf_export import ExportError
from mf_train.job import make_job_plan
from mf_train.models import build_model


def sources(example: Path, world: int, *overrides: str):
    """The plan's holdings of every rank, the ranks chosen, and the whole model's entries."""
    config = config_from_source(load_source(str(example), list(overrides)))
    plan = make_job_plan(config, world)
    model = build_model(config.model, seed=0)
    entries = model.weight_maps()
    found = holdings(config, plan, model)
    return found, source_ranks(found, entries, plan.dims.tensor), entries


def layers(names: frozenset[str]) -> list[int]:
    return sorted({int(name.split(".")[1]) for name in names
                   if name.startswith("decoder_layers.")})


def experts(names: frozenset[str]) -> list[int]:
    return sorted({int(name.split(".mlp.experts.")[1].split(".")[0]) for name in names
                   if ".mlp.experts." in name})


def test_pipeline_x_tensor_x_data_reads_one_file_per_stage_and_tensor_place() -> None:
    """World 8 = pipeline 2 x data 2 x tensor 2 (rank = (stage * 2 + data) * 2 + tensor)."""
    found, chosen, _ = sources(QWEN3, 8, "parallelism.pipeline_parallel=2",
                               "parallelism.tensor_parallel=2")
    assert [h.rank for h in chosen] == [0, 1, 4, 5]
    assert [h.tensor for h in chosen] == [0, 1, 0, 1]
    assert [layers(h.names) for h in found] == [[0, 1]] * 4 + [[2, 3]] * 4
    first, last = found[0].names, found[4].names
    assert "embedding.weight" in first and "final_norm.weight" not in first
    # the tied embedding's copy is on the last stage too
    assert {"embedding.weight", "final_norm.weight"} <= last


def test_interleaved_stages_hold_every_chunk_s_layers() -> None:
    found, chosen, _ = sources(QWEN3, 2, "parallelism.pipeline_parallel=2",
                               "parallelism.pipeline_parallel_schedule=interleaved_1f1b",
                               "parallelism.pipeline_parallel_interleave_num=2")
    assert [h.rank for h in chosen] == [0, 1]
    assert [layers(h.names) for h in found] == [[0, 2], [1, 3]]


def test_expert_shares_over_data_and_tensor_ranks() -> None:
    """Tensor 2 x expert 2 on 4 ranks: expert groups [0, 2] and [1, 3] (over the shard ranks
    of each tensor place). Rank 3 adds nothing: its tensor slices are rank 1's, its experts
    rank 2's. On 2 ranks the experts are split over the tensor ranks themselves."""
    found, chosen, _ = sources(DEEPSEEK, 4, "parallelism.tensor_parallel=2",
                               "parallelism.expert_parallel=2")
    assert [experts(h.names) for h in found] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [h.rank for h in chosen] == [0, 1, 2]
    found, chosen, _ = sources(DEEPSEEK, 2, "parallelism.tensor_parallel=2",
                               "parallelism.expert_parallel=2")
    assert [(h.rank, h.tensor, experts(h.names)) for h in chosen] == [(0, 0, [0, 1]),
                                                                      (1, 1, [2, 3])]
    assert found[0].names - {n for n in found[0].names if ".mlp.experts." in n} == \
        found[1].names - {n for n in found[1].names if ".mlp.experts." in n}


def test_deepseek_v3_stages_hold_their_layers_and_expert_shares() -> None:
    """Pipeline 2 x expert parallel 2 on 4 ranks (stage 0: layers 0-1 with the embedding;
    stage 1: layer 2, the final norm and the head): one file per stage and expert share."""
    found, chosen, entries = sources(DEEPSEEK, 4, "parallelism.pipeline_parallel=2",
                                     "parallelism.expert_parallel=2")
    assert [layers(h.names) for h in found] == [[0, 1], [0, 1], [2], [2]]
    assert [experts(h.names) for h in found] == [[0, 1], [2, 3], [0, 1], [2, 3]]
    assert [h.rank for h in chosen] == [0, 1, 2, 3]
    assert "embedding.weight" in found[0].names and "head.weight" in found[2].names
    assert set().union(*(h.names for h in chosen)) == {entry.ours for entry in entries}


def test_unsplit_weights_are_in_every_tensor_place_and_copies_must_agree() -> None:
    """Pipeline 2 x tensor 2 (rank = stage * 2 + tensor): a weight tensor parallelism does not
    split (a norm) is read from the first rank holding it and copied to both places; the
    tensor ranks' replicas of it and the last stage's copy of the tied embedding must equal
    what was read first."""
    _, chosen, entries = sources(QWEN3, 4, "parallelism.pipeline_parallel=2",
                                 "parallelism.tensor_parallel=2")
    split = {entry.ours for entry in entries if entry.axis is not None}
    arrays = {h.rank: {name: np.full(2, float(h.rank if name in split else h.rank // 2),
                                     np.float32) for name in h.names} for h in chosen}
    for holding in chosen[2:]:  # the last stage's tied copy, equal to the first stage's
        arrays[holding.rank]["embedding.weight"] = arrays[holding.tensor]["embedding.weight"]
    places = tensor_places(chosen, arrays, entries, 2)
    assert places[1]["final_norm.weight"] is places[0]["final_norm.weight"] is \
        arrays[2]["final_norm.weight"]
    assert [place["embedding.weight"][0] for place in places] == [0.0, 1.0]  # rank 0's, 1's
    arrays[3]["embedding.weight"] = np.zeros(2, np.float32)
    with pytest.raises(ExportError, match=r"embedding.weight: rank 3's copy differs from rank "
                                          r"1's \(the run keeps its copies equal"):
        tensor_places(chosen, arrays, entries, 2)
