"""mf-train is installed as its own distribution and imports as `mf_train`."""

from __future__ import annotations

from importlib.metadata import distribution


def test_distribution_is_installed_from_this_checkout() -> None:
    import mf_train

    dist = distribution("mf-train")
    assert dist.metadata["Name"] == "mf-train"
    assert mf_train.__name__ == "mf_train"
