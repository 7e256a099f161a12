"""ropelib.viz.prose: the text of a computed number, shown by the {eval} role without quotes."""

import numpy as np
import pytest
import torch

from ropelib.viz.prose import Shown, shown


@pytest.mark.parametrize(("value", "spec", "text"), [
    (1.909063, ".3f", "1.909"),
    (4096, ",", "4,096"),
    (0.0734, ".1%", "7.3%"),
    (torch.tensor(2.5, dtype=torch.float64), ".2f", "2.50"),
    (np.float32(0.25), ".1e", "2.5e-01"),
    (np.int64(91), "d", "91"),
])
def test_text_and_plain_repr_are_the_formatted_number(value, spec, text):
    result = shown(value, spec)
    assert isinstance(result, Shown) and result == text
    assert repr(result) == text  # what text/plain shows: no quotes


def test_a_tensor_with_several_elements_is_refused_by_format():
    with pytest.raises(TypeError):
        shown(torch.ones(3), ".2f")
