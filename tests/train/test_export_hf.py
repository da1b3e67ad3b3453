"""`mf-train export-hf`: tiny Qwen3 and DeepSeek-V3 runs of 2 steps exported as Hugging Face
directories. The export, read back through mf's own Hugging Face import, gives the logits of
the model loaded from the mf checkpoint; its names and shapes are Hugging Face's (the golden
file transformers wrote); 2-rank FSDP, tensor-parallel, expert-parallel and interleaved
pipeline checkpoints export to weights that the import turns back into every rank's saved
arrays; bfloat16 bytes are float32 rounded to nearest even; what cannot be exported (a
configuration that is not the run's, a pipeline of a model mf-train does not cut) is refused
with the reason."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from checkpoint_samples import as_format_2
from mindspore import Tensor
from runs import DEEPSEEK, QWEN3, ROOT, steps
from tensor_groups import tensor_group

from mf_config.validate import config_from_source, load_source
from mf_train.checkpoint import HFCheckpoint, find_checkpoint, load_hf_weights
from mf_train.checkpoint.hf_write import parse_size
from mf_train.checkpoint.layout import read_common
from mf_train.checkpoint.params import apply_model_params
from mf_train.checkpoint.pieces import PieceIndex
from mf_train.launch.cli import run
from mf_train.models import ModelPart, build_model, load_hf_state
from mf_train.models.hf_weights import local_value

GOLDEN = ROOT / "tests" / "train" / "golden" / "qwen3_hf.npz"
# the tied model of golden/qwen3_tiny.py, with the example's byte vocabulary (512)
QWEN3_SHAPE = ["model.hidden_size=32", "model.intermediate_size=48", "model.num_hidden_layers=2",
               "model.num_attention_heads=4", "model.num_key_value_heads=2", "model.head_dim=12",
               "model.max_position_embeddings=32", "recompute.mode=None",
               "recompute.select_module=null"]
DEEPSEEK_SHAPE = ["model.seq_length=32", "model.max_position_embeddings=32"]
INPUT_IDS = np.random.default_rng(5).integers(0, 256, (2, 16)).astype(np.int32)


def settings(prefix: str, output: Path, shape: list[str]) -> list[str]:
    return [f"train_dataset.dataloader.config.data_path=['1','{prefix}']", "training.steps=2",
            "train_dataset.dataloader.config.seq_length=32", "lr_scheduler.warmup_steps=1",
            f"checkpoint.save_path={output / 'ckpt'}", *shape]


def sets(values: list[str]) -> list[str]:
    return [arg for value in values for arg in ("--set", value)]


def train(example: Path, prefix: str, output: Path, shape: list[str], *more: str) -> Path:
    """A 2-step run (`more`: launch arguments); returns its checkpoint root."""
    args = ["--config", str(example), "--output-dir", str(output),
            *sets(settings(prefix, output, shape))]
    assert run([*args, *more]) == 0
    return output / "ckpt"


def two_ranks(example: Path, prefix: str, output: Path, shape: list[str]) -> Path:
    return train(example, prefix, output, shape, "--nproc", "2", "--timeout", "300")


def saved_weights(checkpoint: Path, place: tuple[int, int] | None = None,
                  ) -> dict[str, np.ndarray]:
    """The checkpoint's weights whole, as one process holds them; with `place` (tensor
    place, degree), the ones tensor parallelism splits as that place holds them."""
    directory = find_checkpoint(checkpoint)
    index = PieceIndex(directory, read_common(directory), "model")
    with index:
        return {name: index.read_whole(name, tensor) for name, tensor in index.by_tensor
                if tensor in (None, place)}


def files_of(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def export(example: Path | None, checkpoint: Path, output: Path, *more: str) -> int:
    """`mf-train export-hf`; `example` None: without `--config` (the saved one is read)."""
    config = [] if example is None else ["--config", str(example)]
    return run(["export-hf", "--checkpoint", str(checkpoint), *config, "--output", str(output),
                *more])


def model_config(example: Path, shape: list[str]):
    return config_from_source(load_source(str(example), shape)).model


def logits(model) -> np.ndarray:
    return model.logits(Tensor(INPUT_IDS)).asnumpy()


def assert_round_trip(example: Path, shape: list[str], checkpoint: Path,
                      exported: Path) -> None:
    """The export, through mf's Hugging Face import, gives the logits of the one-process model
    that the checkpoint's rank files together hold (every parameter in one of them)."""
    config = model_config(example, shape)
    saved = build_model(config, seed=1)
    whole = saved_weights(checkpoint)
    assert whole.keys() == {name for name, _ in saved.parameters_and_names()}
    apply_model_params(saved.parameters_and_names(), whole)
    imported = build_model(config, seed=2)
    load_hf_state(imported, load_hf_weights(exported))
    np.testing.assert_allclose(logits(imported), logits(saved), rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def qwen3_run(data_prefix, tmp_path_factory) -> Path:
    return train(QWEN3, data_prefix, tmp_path_factory.mktemp("qwen3"), QWEN3_SHAPE)


@pytest.fixture(scope="module")
def qwen3_export(qwen3_run, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("qwen3_hf") / "hf"
    assert export(QWEN3, qwen3_run, output, *sets(QWEN3_SHAPE)) == 0
    return output


def test_qwen3_export_gives_the_checkpoint_logits(qwen3_run, qwen3_export) -> None:
    assert sorted(path.name for path in qwen3_export.iterdir()) == ["config.json",
                                                                   "model.safetensors"]
    assert_round_trip(QWEN3, QWEN3_SHAPE, qwen3_run, qwen3_export)


def test_qwen3_export_has_hugging_face_names_shapes_and_config(qwen3_export) -> None:
    golden = np.load(GOLDEN)
    names = [str(name) for name in golden["tied/names"]]
    shapes = [[512 if size == 64 else size for size in shape]  # golden vocabulary: 64
              for shape in json.loads(str(golden["tied/shapes"]))]
    weights = load_hf_weights(qwen3_export)
    assert sorted(weights) == names
    assert [list(weights[name].shape) for name in names] == shapes
    config = json.loads((qwen3_export / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["model_type"] == "qwen3"
    assert config["dtype"] == "float32" and "torch_dtype" not in config
    assert (config["hidden_size"], config["head_dim"], config["num_key_value_heads"]) == (32, 12, 2)
    assert config["tie_word_embeddings"] is True
    assert not {"compute_dtype", "params_dtype", "seq_length"} & set(config)


def test_deepseek_v3_export_gives_the_checkpoint_logits(data_prefix, tmp_path) -> None:
    checkpoint = train(DEEPSEEK, data_prefix, tmp_path / "run", DEEPSEEK_SHAPE)
    assert export(DEEPSEEK, checkpoint, tmp_path / "hf", *sets(DEEPSEEK_SHAPE)) == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["architectures"], config["model_type"]) == (["DeepseekV3ForCausalLM"],
                                                               "deepseek_v3")
    names = set(load_hf_weights(tmp_path / "hf"))
    assert "model.layers.0.self_attn.kv_a_proj_with_mqa.weight" in names
    assert "model.layers.1.mlp.experts.0.gate_proj.weight" in names
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in names
    assert_round_trip(DEEPSEEK, DEEPSEEK_SHAPE, checkpoint, tmp_path / "hf")


def bfloat16_reference(values: np.ndarray) -> np.ndarray:
    """Each float32's nearest bfloat16 (ties to the even pattern), chosen by comparing the
    two bfloat16 neighbours' distances in float64: an independent check of the bit rounding."""
    bits = values.astype(np.float32).view(np.uint32)
    low = (bits >> 16).astype(np.uint32)
    high = low + 1

    def as_float(top: np.ndarray) -> np.ndarray:
        return (top << 16).astype(np.uint32).view(np.float32).astype(np.float64)

    exact = values.astype(np.float64)
    below, above = np.abs(exact - as_float(low)), np.abs(as_float(high) - exact)
    pick_high = (above < below) | ((above == below) & (low % 2 == 1))
    return np.where(pick_high, high, low).astype(np.uint16)


def raw_tensors(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    body = data[8 + length:]
    return {name: (info["dtype"], info["shape"], body[slice(*info["data_offsets"])])
            for name, info in header.items() if name != "__metadata__"}


NUMBERS = {
    "Qwen3ForCausalLM": {
        int: ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "head_dim", "max_position_embeddings", "max_window_layers"],
        float: ["initializer_range", "rms_norm_eps", "attention_dropout"],
        bool: ["use_cache", "tie_word_embeddings", "attention_bias", "use_sliding_window"]},
    "DeepseekV3ForCausalLM": {
        int: ["vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
              "num_hidden_layers", "num_attention_heads", "n_shared_experts", "n_routed_experts",
              "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "max_position_embeddings"],
        float: ["routed_scaling_factor", "initializer_range", "rms_norm_eps"],
        bool: ["use_cache", "tie_word_embeddings", "attention_bias"]},
}
"""The config.json keys transformers 5.25's `Qwen3Config` and `DeepseekV3Config` type as a
number or a bool without `None` (read from their dataclass fields); a `null` there makes
`from_pretrained` fail (StrictDataclassFieldValidationError)."""


@pytest.mark.parametrize("example", [QWEN3, DEEPSEEK], ids=["qwen3", "deepseek_v3"])
def test_config_json_has_a_number_wherever_transformers_types_one(example, qwen3_export,
                                                                 data_prefix,
                                                                 tmp_path) -> None:
    exported = qwen3_export
    if example == DEEPSEEK:
        checkpoint = train(DEEPSEEK, data_prefix, tmp_path / "run", DEEPSEEK_SHAPE)
        exported = tmp_path / "hf"
        assert export(None, checkpoint, exported) == 0
    config = json.loads((exported / "config.json").read_text())
    for kind, keys in NUMBERS[config["architectures"][0]].items():
        for key in keys:
            value = config.get(key)
            if kind is float:
                assert isinstance(value, (int, float)) and not isinstance(value, bool), key
            else:
                assert type(value) is kind, (key, value)


def test_the_configuration_saved_with_the_checkpoint_is_the_run_s(data_prefix, qwen3_run,
                                                                 qwen3_export, tmp_path,
                                                                 capsys) -> None:
    """Each checkpoint holds the run's effective configuration (the example with the run's
    `--set` overrides applied), so `export-hf` needs no `--config`: the same files; the
    message names the iteration exported."""
    directory = qwen3_run / "iteration_00000002"
    saved = config_from_source(load_source(str(directory / "config.yaml")))
    given = config_from_source(load_source(
        str(QWEN3), settings(data_prefix, qwen3_run.parent, QWEN3_SHAPE)))
    assert saved.to_dict() == given.to_dict()
    capsys.readouterr()
    assert export(None, qwen3_run, tmp_path / "hf") == 0
    assert capsys.readouterr().err == (f"mf-train export-hf: wrote {tmp_path / 'hf'} "
                                       f"from {directory}\n")
    assert files_of(tmp_path / "hf") == files_of(qwen3_export)


def test_a_checkpoint_saved_without_its_configuration_asks_for_one(qwen3_run, tmp_path,
                                                                 capsys) -> None:
    old = as_format_2(qwen3_run / "iteration_00000002", tmp_path / "old" / "iteration_00000002")
    capsys.readouterr()
    assert export(None, old, tmp_path / "hf") == 2
    assert capsys.readouterr().err == (
        f"mf-train export-hf: {old} was saved without its configuration (by an earlier mf): "
        "pass the run's train.yaml with --config FILE\n")
    damaged = tmp_path / "damaged"
    shutil.copytree(qwen3_run / "iteration_00000002", damaged)
    with open(damaged / "config.yaml", "a") as handle:
        handle.write("# edited\n")
    assert export(None, damaged, tmp_path / "hf") == 2
    assert capsys.readouterr().err == (
        f"mf-train export-hf: {damaged / 'config.yaml'}: damaged (its SHA-256 differs from "
        "common.json's)\n")


def test_bfloat16_export_is_float32_rounded_to_nearest_even(qwen3_run, qwen3_export,
                                                             tmp_path) -> None:
    assert export(QWEN3, qwen3_run, tmp_path / "bf16", *sets(QWEN3_SHAPE),
                  "--dtype", "bfloat16") == 0
    full = raw_tensors(qwen3_export / "model.safetensors")
    half = raw_tensors(tmp_path / "bf16" / "model.safetensors")
    assert full.keys() == half.keys()
    for name, (dtype, shape, data) in half.items():
        assert dtype == "BF16" and shape == full[name][1]
        values = np.frombuffer(full[name][2], "<f4")
        assert np.frombuffer(data, "<u2").tolist() == bfloat16_reference(values).tolist(), name
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"


def test_sharded_files_hold_the_same_weights(qwen3_run, qwen3_export, tmp_path) -> None:
    assert export(QWEN3, qwen3_run, tmp_path / "sharded", *sets(QWEN3_SHAPE),
                  "--max-shard-size", "20KB") == 0
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    for file in files:  # within the limit, unless one tensor alone exceeds it (the embedding)
        tensors = raw_tensors(tmp_path / "sharded" / file)
        held = sum(len(data) for _, _, data in tensors.values())
        assert held <= 20_000 or len(tensors) == 1, file
    whole, sharded = load_hf_weights(qwen3_export), load_hf_weights(tmp_path / "sharded")
    assert sorted(index["weight_map"]) == sorted(whole)
    assert index["metadata"]["total_size"] == sum(value.nbytes for value in whole.values())
    for name, value in whole.items():
        np.testing.assert_array_equal(sharded[name], value, err_msg=name)


def test_the_help_of_mf_train_names_the_export(capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        run(["--help"])
    assert stopped.value.code == 0
    assert "mf-train export-hf --checkpoint DIR --output DIR" in \
        " ".join(capsys.readouterr().out.split())


def test_sizes_are_read_as_transformers_writes_them() -> None:
    assert parse_size("5GB") == 5 * 10**9
    assert parse_size("500MiB") == 500 * 2**20
    assert parse_size("1000") == 1000


def test_refusals_say_what_is_wrong(qwen3_run, qwen3_export, tmp_path, capsys) -> None:
    def refused(*args: str) -> str:
        capsys.readouterr()
        assert export(QWEN3, *args) == 2
        return capsys.readouterr().err

    before = (qwen3_export / "model.safetensors").read_bytes()
    err = refused(qwen3_run, qwen3_export, *sets(QWEN3_SHAPE))
    assert f"--output {qwen3_export} is not empty" in err and "--force" in err
    assert (qwen3_export / "model.safetensors").read_bytes() == before
    assert "expected a size such as 5GB" in refused(qwen3_run, tmp_path / "a", *sets(QWEN3_SHAPE),
                                                    "--max-shard-size", "big")
    assert "holds no complete checkpoint" in refused(tmp_path, tmp_path / "b")
    assert not (tmp_path / "a").exists()


def test_a_format_2_checkpoint_is_refused_naming_its_conversion(qwen3_run, tmp_path,
                                                                capsys) -> None:
    """A one-process checkpoint of format 2 (an earlier mf's, one file per rank) is refused
    in one line naming the command that converts it (`mf-train` resuming it on its layout,
    training nothing); nothing is written."""
    old = as_format_2(qwen3_run / "iteration_00000002", tmp_path / "old" / "iteration_00000002")
    capsys.readouterr()
    assert export(QWEN3, old, tmp_path / "hf", *sets(QWEN3_SHAPE)) == 2
    assert capsys.readouterr().err == (
        f"mf-train export-hf: {old} is in format 2 (an earlier mf's), which is read only to "
        "convert it: convert it on its layout, training nothing: `mf-train --config <its "
        f"train.yaml> --nproc 1 --output-dir <new directory> --set checkpoint.load_path={old} "
        "--set training.steps=2` saves step 2 in the format that loads on any layout; then "
        "read the new checkpoint\n")
    assert not (tmp_path / "hf").exists()


def test_force_replaces_the_output(qwen3_run, qwen3_export, tmp_path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "stale.txt").write_text("old")
    assert export(QWEN3, qwen3_run, target, *sets(QWEN3_SHAPE), "--force") == 0
    assert sorted(path.name for path in target.iterdir()) == ["config.json", "model.safetensors"]
    assert [path.name for path in tmp_path.iterdir()] == ["out"]


def assert_reshards_to_ranks(example: Path, shape: list[str], checkpoint: Path,
                             exported: Path, tensor: int) -> None:
    """The import's `local_value`, reading each tensor place's slices from the exported
    files, gives back the weights the checkpoint holds for that place."""
    entries = build_model(model_config(example, shape), seed=0).weight_maps()
    with HFCheckpoint(exported) as source:
        for place in range(tensor):
            saved = saved_weights(checkpoint, (place, tensor) if tensor > 1 else None)
            group = tensor_group(place, tensor) if tensor > 1 else None
            for entry in entries:
                value = local_value(entry, source, group)
                np.testing.assert_array_equal(value, saved[entry.ours], err_msg=entry.ours)


@pytest.mark.ranks
def test_deepseek_v3_tensor_parallel_export_gives_back_each_rank_s_shard(data_prefix,
                                                                         tmp_path) -> None:
    """Multi-head latent attention, experts and router of a TP 2 DeepSeek-V3 run."""
    layout = "parallelism.tensor_parallel=2"
    checkpoint = two_ranks(DEEPSEEK, data_prefix, tmp_path / "run", [*DEEPSEEK_SHAPE, layout])
    assert export(DEEPSEEK, checkpoint, tmp_path / "hf", *sets([*DEEPSEEK_SHAPE, layout])) == 0
    assert_reshards_to_ranks(DEEPSEEK, DEEPSEEK_SHAPE, checkpoint, tmp_path / "hf", 2)


@pytest.mark.ranks
@pytest.mark.parametrize("layout", [["parallelism.tensor_parallel=2"],
                                    ["parallelism.data_parallel_shard_strategy="
                                     "optim_grads_params"]], ids=["tensor", "fsdp"])
def test_two_rank_exports_give_back_every_rank_s_arrays(data_prefix, qwen3_export, tmp_path,
                                                        layout, capsys) -> None:
    """Re-sharded by the import's own code, the export of a 2-rank run is each tensor
    place's saved arrays exactly; and it is the 1-process run's export up to the runs'
    rounding. The checkpoint says how it was split: exported with a configuration that
    lacks the run's parallelism, the files are the same."""
    checkpoint = two_ranks(QWEN3, data_prefix, tmp_path / "run", [*QWEN3_SHAPE, *layout])
    assert export(QWEN3, checkpoint, tmp_path / "hf", *sets([*QWEN3_SHAPE, *layout])) == 0
    assert export(QWEN3, checkpoint, tmp_path / "plain", *sets(QWEN3_SHAPE)) == 0
    assert files_of(tmp_path / "plain") == files_of(tmp_path / "hf")
    assert export(None, checkpoint, tmp_path / "saved") == 0
    assert files_of(tmp_path / "saved") == files_of(tmp_path / "hf")
    exported = load_hf_weights(tmp_path / "hf")
    assert_reshards_to_ranks(QWEN3, QWEN3_SHAPE, checkpoint, tmp_path / "hf",
                             2 if "tensor" in layout[0] else 1)
    single = load_hf_weights(qwen3_export)
    for name, value in single.items():
        np.testing.assert_allclose(exported[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


def step_losses(output: Path) -> list[float]:
    return [step["loss"] for step in steps(output)]


@pytest.mark.ranks
def test_tensor_parallel_and_fsdp_runs_start_from_a_sharded_bfloat16_export(
        data_prefix, qwen3_run, tmp_path) -> None:
    """The export in bfloat16, split over several files, is where three runs start: one
    process, two tensor-parallel ranks and two FSDP ranks, each rank reading only what it
    holds (the log says how much: its tensor-parallel slices; its FSDP slices' rows, never
    the whole model). Their losses agree as the layouts' rounding allows."""
    exported = tmp_path / "hf"
    assert export(QWEN3, qwen3_run, exported, "--dtype", "bfloat16", "--max-shard-size",
                  "20KB", *sets(QWEN3_SHAPE)) == 0
    assert len(list(exported.glob("*.safetensors"))) > 1
    start = [*QWEN3_SHAPE, f"checkpoint.load_path={exported}", "checkpoint.no_load_optim=True"]
    train(QWEN3, data_prefix, tmp_path / "one", start)
    one = step_losses(tmp_path / "one")
    assert len(one) == 2
    for name, layout in [("tp", "parallelism.tensor_parallel=2"),
                         ("fsdp", "parallelism.data_parallel_shard_strategy="
                                  "optim_grads_params")]:
        two_ranks(QWEN3, data_prefix, tmp_path / name, [*start, layout])
        np.testing.assert_allclose(step_losses(tmp_path / name), one, rtol=1e-5)
        reads = []
        for rank in range(2):
            log = (tmp_path / name / "logs" / f"worker_{rank}.log").read_text()
            read, total = (float(size) for size in re.search(
                r"this rank read ([\d.]+) KiB of the ([\d.]+) KiB there", log).groups())
            reads.append(read)
            if name == "tp":  # half of the split weights, all of the norms
                assert total / 2 < read < total
            else:  # its half of each unit's flat buffer, from the rows that hold it
                assert read < 0.6 * total
        if name == "fsdp":
            assert sum(reads) >= total


QWEN3_FOUR_LAYERS = [*QWEN3_SHAPE[:2], "model.num_hidden_layers=4", *QWEN3_SHAPE[3:]]
PIPELINE = ["parallelism.pipeline_parallel=2"]
INTERLEAVED = [*PIPELINE, "parallelism.pipeline_parallel_schedule=interleaved_1f1b",
               "parallelism.pipeline_parallel_interleave_num=2"]


@pytest.mark.ranks
@pytest.mark.parametrize(("example", "shape", "layout", "parts"), [
    (QWEN3, QWEN3_FOUR_LAYERS, INTERLEAVED, (ModelPart((0, 2), embedding=True, head=False),
                                             ModelPart((1, 3), embedding=False, head=True))),
    (DEEPSEEK, DEEPSEEK_SHAPE, PIPELINE, (ModelPart((0, 1), embedding=True, head=False),
                                          ModelPart((2,), embedding=False, head=True))),
], ids=["qwen3-interleaved", "deepseek-v3"])
def test_pipeline_export_gives_back_each_stage_s_arrays(data_prefix, tmp_path, capsys,
                                                        example, shape, layout, parts) -> None:
    """2 stages x 2 virtual chunks of a 4-layer tied Qwen3 (stage 0 saved layers 0 and 2 and
    the embedding, stage 1 layers 1 and 3 and the final norm; its copy of the tied embedding
    is not saved twice), and 2 stages of DeepSeek-V3 (stage 0 layers 0-1 and the embedding,
    stage 1 layer 2, the final norm and the head). The export, imported into each stage's
    part, is that stage's weights exactly, and it gives the logits of the model the two files
    hold together; a configuration without the pipeline exports the same files."""
    checkpoint = two_ranks(example, data_prefix, tmp_path / "run", [*shape, *layout])
    assert export(example, checkpoint, tmp_path / "hf", *sets([*shape, *layout])) == 0
    assert export(example, checkpoint, tmp_path / "plain", *sets(shape)) == 0
    assert files_of(tmp_path / "plain") == files_of(tmp_path / "hf")
    exported = load_hf_weights(tmp_path / "hf")
    config = model_config(example, shape)
    whole = saved_weights(checkpoint)
    for part in parts:
        stage = build_model(config, seed=3, part=part)
        load_hf_state(stage, exported)
        for name, param in stage.parameters_and_names():
            np.testing.assert_array_equal(param.asnumpy(), whole[name], err_msg=name)
    assert_round_trip(example, shape, checkpoint, tmp_path / "hf")


def routed_experts(arrays: dict[str, np.ndarray]) -> set[int]:
    return {int(name.split(".mlp.experts.")[1].split(".")[0]) for name in arrays
            if ".mlp.experts." in name}


@pytest.mark.ranks
def test_expert_parallel_export_gives_back_each_rank_s_experts(data_prefix, tmp_path,
                                                               capsys) -> None:
    """Expert parallel 2 DeepSeek-V3 (4 routed experts; rank 0 saved experts 0-1, rank 1
    experts 2-3): the export, re-sharded by the import's code, is the saved weights exactly,
    and gives the logits of the model the two files hold together; a configuration without
    expert parallelism exports the same files."""
    layout = [*DEEPSEEK_SHAPE, "parallelism.expert_parallel=2"]
    checkpoint = two_ranks(DEEPSEEK, data_prefix, tmp_path / "run", layout)
    directory = find_checkpoint(checkpoint)
    written = [{name for name, *_ in read_common(directory)["files"][
        f"deepseek_v3_tiny-model-{rank:07d}-0000002.safetensors"]["pieces"]}
        for rank in range(2)]
    assert [routed_experts(names) for names in written] == [{0, 1}, {2, 3}]
    assert export(DEEPSEEK, checkpoint, tmp_path / "hf", *sets(layout)) == 0
    assert export(DEEPSEEK, checkpoint, tmp_path / "plain", *sets(DEEPSEEK_SHAPE)) == 0
    assert files_of(tmp_path / "plain") == files_of(tmp_path / "hf")
    exported = load_hf_weights(tmp_path / "hf")
    assert "model.layers.2.mlp.experts.3.up_proj.weight" in exported
    assert_reshards_to_ranks(DEEPSEEK, DEEPSEEK_SHAPE, checkpoint, tmp_path / "hf", 1)
    assert_round_trip(DEEPSEEK, DEEPSEEK_SHAPE, checkpoint, tmp_path / "hf")
