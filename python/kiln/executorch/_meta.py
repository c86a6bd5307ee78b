"""Refuses models whose weights are on PyTorch's ``meta`` device before exporting them: such a
tensor has a shape but no data, and torch.export fails on it deep inside ("Cannot copy out of
meta tensor; no data!", or a device mismatch against the example inputs)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.export import ExportedProgram


def _meta_names(model) -> list[str]:
    if isinstance(model, ExportedProgram):
        tensors = {**model.state_dict, **getattr(model, "constants", {})}
    elif isinstance(model, torch.nn.Module):
        tensors = dict(model.named_parameters())
        tensors.update(model.named_buffers())
    else:
        return []
    return [n for n, t in tensors.items() if isinstance(t, torch.Tensor) and t.is_meta]


def check_not_meta(model, example_inputs=None) -> None:
    """Raises ValueError when a weight or an example input of `model` (an nn.Module, an
    ExportedProgram or a dict of methods, as export() takes) is a meta tensor."""
    items = model.items() if isinstance(model, Mapping) else [("forward", (model, example_inputs))]
    for method, item in items:
        mod, inputs = (item[0], item[1]) if isinstance(item, (tuple, list)) else (item, None)
        names = _meta_names(mod)
        if names:
            what = (
                f"weights '{names[0]}' and {len(names) - 1} more are"
                if len(names) > 1
                else f"weight '{names[0]}' is"
            )
            raise ValueError(
                f"{method}: {what} on the meta device (shapes without data), so there is "
                "nothing to export. Give the model real weights first (model.to_empty("
                "device='cpu') and then load_state_dict(...), or build it without "
                "device='meta')"
            )
        flat = inputs if isinstance(inputs, (tuple, list)) else [inputs]
        for i, x in enumerate(flat):
            if isinstance(x, torch.Tensor) and x.is_meta:
                raise ValueError(
                    f"{method}: example input {i} is a meta tensor; pass a tensor with data "
                    "(e.g. torch.randn of the same shape)"
                )
