"""The module lists (`recompute.select_module`, `recompute_comm.select_module`,
`swap.op_swap[].op_name`) are checked at validation against the modules each model declares
for its layers (`ModelSettings.layer_modules`): the declarations equal what the built models
hold, a misspelt entry is one error with its YAML path and line (from `mf-config validate`
and from mf-train before any rank starts), and validation refuses exactly the entries the
real resolver (`mf_memory.layers.resolve_module`) fails on."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("mindspore")

from mf_config import load_config
from mf_config.components import model_settings
from mf_config.validate import check_source, load_source
from mf_memory.layers import ContractError, resolve_module
from mf_train.launch.cli import run
from mf_train.models import build_model

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = ROOT / "examples" / "qwen3_tiny.yaml"
DEEPSEEK = ROOT / "examples" / "deepseek_v3_tiny.yaml"


@pytest.mark.parametrize(("example", "sets"), [
    (QWEN3, []),
    (DEEPSEEK, []),                                                   # dense layer 0, MoE 1-2
    (DEEPSEEK, ["model.q_lora_rank=16", "model.n_shared_experts=0"]),  # query compression
], ids=["qwen3", "deepseek_v3", "deepseek_v3 q_lora no shared"])
def test_declared_modules_are_the_built_layers_modules(example: Path, sets: list[str]) -> None:
    config = load_config(example, sets)
    declared = model_settings(config.model)
    model = build_model(config.model)
    for index, layer in enumerate(model.decoder_layers):
        built = {name for name, _ in layer.cells_and_names() if name}
        assert declared.layer_modules(index) == built, index


def module_errors(example: Path, sets: list[str]) -> list[tuple[str, int | None, str]]:
    """(path, line, message) of each error validation gives on module paths."""
    _, issues = check_source(load_source(example, sets))
    return [(issue.path, issue.line, issue.message) for issue in issues
            if issue.severity == "error" and "no module" in issue.message]


def test_a_misspelt_entry_is_one_error_at_its_line(tmp_path: Path) -> None:
    text = QWEN3.read_text(encoding="utf-8")
    assert text.count('"attention": [\'0-1\']') == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace('"attention": [\'0-1\']', '"atention": [\'0-1\']'),
                   encoding="utf-8")
    line = bad.read_text(encoding="utf-8").splitlines().index(
        '    "atention": [\'0-1\']') + 1
    [(path, at, message)] = module_errors(bad, [])
    assert (path, at) == ('recompute.select_module["atention"]', line)
    assert message.endswith("did you mean 'attention'?")
    assert module_errors(QWEN3, []) == []


@pytest.mark.parametrize(("sets", "path"), [
    (["recompute_comm.enable=true", "recompute_comm.select_module={attention.qvk: ['0']}"],
     'recompute_comm.select_module["attention.qvk"]'),
    (["swap.enable=true", "recompute.mode=None", "swap.op_swap=[{op_name: mpl, layers: ['1']}]"],
     "swap.op_swap[0].op_name"),
], ids=["recompute_comm", "op_swap"])
def test_every_module_list_is_checked(sets: list[str], path: str) -> None:
    assert [error[0] for error in module_errors(QWEN3, sets)] == [path]


@pytest.mark.parametrize("module", [
    "attention", "attention.qkv", "mlp.experts", "mlp.experts.3.down", "mlp.shared_experts",
    "mlp.router", "attention.q_proj", "attention.q_a_proj", "mlp.gate_up", "atention",
    "mlp.expert", "mlp.experts.4", "post_norm", "mlp.down"])
def test_validation_refuses_what_the_resolver_fails_on(module: str) -> None:
    """Over DeepSeek-V3's dense layer 0 and MoE layer 1 (4 experts, a plain q_proj)."""
    model = build_model(load_config(DEEPSEEK).model)
    for index in (0, 1):
        sets = ["recompute.mode=select", f"recompute.select_module={{{module}: ['{index}']}}"]
        try:
            resolve_module(model.decoder_layers[index], module, "select_module", index)
            resolves = True
        except ContractError:
            resolves = False
        assert (module_errors(DEEPSEEK, sets) == []) == resolves, (module, index)


def test_mf_train_refuses_a_misspelt_entry_before_any_rank_starts(tmp_path: Path,
                                                                  capsys) -> None:
    status = run(["--config", str(QWEN3), "--output-dir", str(tmp_path / "out"), "--nproc", "2",
                  "--set", "recompute.select_module={mlp.dwn: ['1']}"])
    err = capsys.readouterr().err
    assert status == 2
    assert "recompute.select_module[\"mlp.dwn\"]: layer 1 of the model has no module" in err
    assert "Traceback" not in err and "starting 2 ranks" not in err
    assert not (tmp_path / "out" / "logs").exists()


def test_a_cell_that_tensor_parallelism_adds_is_not_refused() -> None:
    """`attention.qkv` is a `ColumnParallelLinear` under tensor parallelism, whose gather cell
    (`enter`) communication recompute may name; on one rank it has no sub-module to declare."""
    sets = ["parallelism.tensor_parallel=2", "recompute_comm.enable=true",
            "recompute_comm.select_module={attention.qkv.enter: ['0']}"]
    assert module_errors(QWEN3, sets) == []
