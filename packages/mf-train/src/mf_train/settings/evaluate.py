"""The keys of a `callbacks:` item of type `Evaluate` (the validation loss during training;
the callback is `mf_train.observe.evaluation.Evaluate`).

No `from __future__ import annotations` here: cattrs reads the field types at run time.
"""

from mf_config.sections import Section, section, setting


@section
class EvaluateSettings(Section):
    """How often the valid split is evaluated, over how many batches, and whether the test
    split is evaluated after the last step."""

    interval: int = setting(
        50, "Evaluate after the steps with step % interval == 0, and after the last step.",
        gt=0)
    iters: int = setting(
        10, "Batches each evaluation reads: each a global batch of the valid split "
        "(training.global_batch_size samples, cut into micro-batches as a training step's "
        "are), as Megatron's eval_iters: global batches, not micro-batches, so that every "
        "layout reads the same samples.", gt=0)
    test: bool = setting(
        False, "After the last step, also evaluate the test split: its first `iters` global "
        "batches, as test_loss and test_ppl on the last step (Megatron's evaluation of the "
        "test split after training).")
