"""Parameter sets validate at construction and name the field at fault."""

import math
import os
import sys

import pytest

from veil.client.encoders import make_encoder
from veil.shared import (
    KINDS,
    BooleanParams,
    CategoryParams,
    NumberParams,
    ParameterError,
    StringParams,
)
from veil.shared.kinds.number import GRID_TOLERANCE
from veil.shared.registry import Metric, Registry


@pytest.mark.parametrize(
    ("make", "field", "message"),
    [
        (lambda: StringParams(f=1.5), "f", "The 'f' parameter of StringParams must be a number in [0, 1]. Got 1.5 instead."),
        (lambda: StringParams(k=0), "k", "must be an integer in [1, 65536]"),
        (lambda: StringParams(k=8.0), "k", "must be an integer"),
        (lambda: StringParams(h=True), "h", "Got True instead"),
        (lambda: StringParams(m=70000), "m", "[1, 65536]"),
        (lambda: StringParams(p=0.8, q=0.7), "q", "must be greater than p=0.8"),
        (lambda: StringParams(p=float("nan")), "p", "Got nan"),
        (lambda: CategoryParams(categories=()), "categories", "1 to 4096 non-empty strings"),
        (lambda: CategoryParams(categories=("a", "a")), "categories", "listed twice"),
        (lambda: CategoryParams(categories=("a", "")), "categories", "non-empty"),
        (lambda: BooleanParams(alpha=1.0), "alpha", "[0, 1)"),
        (lambda: BooleanParams(beta=0.0), "beta", "(0, 1)"),
        (lambda: NumberParams(low=5, high=5), "high", "greater than low=5"),
        (lambda: NumberParams(mechanism="exponential"), "mechanism", "one of 'laplace'"),
        (lambda: NumberParams(mechanism="gaussian"), "delta", "try 1e-6"),
        (lambda: NumberParams(delta=1e-6), "delta", "only to mechanism='gaussian'"),
        (lambda: NumberParams(epsilon=0), "epsilon", "(0, 50]"),
        (lambda: NumberParams(resolution=0), "resolution", "[1, 1048576]"),
        # in range as declared, but 0 or 1 once realized as N / 2**32
        (lambda: BooleanParams(alpha=0.999999999999), "alpha", "realized as 1"),
        (lambda: BooleanParams(beta=1e-300), "beta", "it must be at least 2**-32"),
        (lambda: BooleanParams(beta=0.9999999999999), "beta", "it must be at most 1 - 2**-32"),
        (lambda: CategoryParams(categories=("a", "b"), p=0.5, q=0.5000000001), "q",
         "both are realized as 0.5, which says nothing; q must be at least 0.5000000002328306"),
        (lambda: StringParams(p=0.25, q=0.25 + 1e-11), "q", "both are realized as 0.25"),
    ],
)
def test_invalid_parameters_name_the_field(make, field, message):
    with pytest.raises(ParameterError) as info:
        make()
    assert info.value.field == field
    assert message in str(info.value)


def test_large_filters_are_supported():
    params = StringParams(k=4096, h=16, m=256)
    assert params.k == 4096 and params.h == 16


@pytest.mark.parametrize(
    "params",
    [
        StringParams(k=32, h=4, m=8, p=0.39, q=0.61, f=0.45),
        CategoryParams(categories=("red", "green", "blue")),
        BooleanParams(alpha=0.25, beta=0.4),
        NumberParams(low=-1, high=3.5, mechanism="gaussian", epsilon=0.5, delta=1e-7),
        NumberParams(low=0, high=100, mechanism="1bitmean", epsilon=2.0, resolution=8),
    ],
)
def test_dict_round_trip(params):
    data = params.to_dict()
    assert data["kind"] == params.kind
    assert KINDS[data["kind"]].from_dict(data) == params


def test_unknown_keys_are_refused_by_name():
    with pytest.raises(ParameterError) as info:
        StringParams.from_dict({"k": 8, "hashes": 2})
    assert info.value.field == "hashes"


def test_parameters_are_immutable():
    params = StringParams()
    with pytest.raises(AttributeError):
        params.k = 64  # type: ignore[misc]


def test_category_lookup_error_lists_choices():
    params = CategoryParams(categories=("a", "b"))
    assert params.index("b") == 1
    with pytest.raises(ParameterError, match=r"^is not one of the 2 categories \('a', 'b'\)$"):
        params.index("c")  # the value itself is never shown: it may be private, or huge
    with pytest.raises(ParameterError, match=r"^must be a str, one of the 2 categories "
                                             r"\('a', 'b'\); got bytes$"):
        params.index(b"a")


def test_number_noise_scale():
    laplace = NumberParams(low=0, high=10, epsilon=0.5, resolution=100)
    assert laplace.step == pytest.approx(0.1)
    assert laplace.laplace_scale == pytest.approx(200)
    # discrete Laplace variance 2r/(1-r)^2 with r = exp(-1/b) tends to 2 b^2 for large b
    assert laplace.noise_variance() == pytest.approx(2 * (200 * 0.1) ** 2, rel=1e-3)
    assert NumberParams(mechanism="1bitmean").noise_variance() == 0.0
    assert math.isfinite(NumberParams(mechanism="gaussian", delta=1e-6).gaussian_sigma)


def test_probabilities_keep_a_margin_of_2_to_the_minus_32_from_the_ends_they_may_not_take():
    assert BooleanParams(alpha=1 - 2**-32, beta=2**-32).epsilon_1 < math.inf
    assert BooleanParams(beta=1 - 2**-32).epsilon_1 < math.inf
    assert BooleanParams(alpha=1e-300).epsilon_1 == pytest.approx(0, abs=1e-300)  # as alpha=0
    assert CategoryParams(categories=("a", "b"), p=0.5, q=0.5 + 2**-32).epsilon_1 > 0


@pytest.mark.parametrize(
    ("settings", "field", "message"),
    [
        # the grid step (high - low) / resolution must be a positive normal float
        ({"high": 5e-324}, "high", "= 0.0 is not a positive normal float"),
        ({"high": 5e-308}, "high", "is not a positive normal float"),
        ({"high": 5e-324, "mechanism": "1bitmean"}, "high", "is not a positive normal float"),
        # ... whose points floats can tell apart
        ({"low": 1e16, "high": 1e16 + 14}, "high", "so grid points would coincide"),
        # ... and on which honest payloads read back within GRID_TOLERANCE
        ({"low": 1e12 + 0.1, "high": 1e12 + 100.4}, "high", "report values shifted nearer 0"),
        ({"high": 6.4, "epsilon": 1e-8}, "epsilon", "raise epsilon or lower resolution"),
        ({"mechanism": "gaussian", "delta": 1e-6, "epsilon": 1e-20}, "epsilon",
         "raise epsilon or lower resolution"),
        # numbers floats cannot hold
        ({"epsilon": 5e-324}, "epsilon", "honest payloads reach inf, beyond 1e+100"),
        ({"mechanism": "gaussian", "delta": 5e-324}, "delta", "the smallest normal float"),
        ({"high": 10**400}, "high", "[-1e+100, 1e+100] (payloads beyond overflow sums of "
                                    "squares). Got an integer of about 401 digits instead."),
        ({"low": -(10**400)}, "low", "Got an integer of about 401 digits instead."),
    ],
)
def test_a_number_grid_that_floats_cannot_carry_is_refused(settings, field, message):
    with pytest.raises(ParameterError) as info:
        NumberParams(**{"low": 0, **settings})
    assert info.value.field == field
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("low", "high", "resolution", "narrower"),
    [
        (0.0, 64 * sys.float_info.min, 64, 32 * sys.float_info.min),  # the least normal step
        (1000.1, 1000.4, 1 << 20, 1000.2),  # payloads near 1000 with steps of 2.9e-7
    ],
)
def test_a_grid_at_the_limits_reads_its_honest_reports_back(low, high, resolution, narrower):
    params = NumberParams(low=low, high=high, resolution=resolution)
    encoder_metric = Metric("n", params)
    for value in (low, (low + high) / 2, high):
        for _ in range(50):
            payload = make_encoder(encoder_metric, os.urandom(32), 0).encode(value)
            # read back on the grid, as the encoder wrote it (not refused as off_grid)
            assert params.parse_payload(payload) == pytest.approx(
                payload, abs=GRID_TOLERANCE * params.step)
    with pytest.raises(ParameterError) as info:
        NumberParams(low=low, high=narrower, resolution=resolution)
    assert info.value.field == "high"


def test_privacy_targets_blame_p_when_p_leaves_q_no_room() -> None:
    """With targets the registry gives no q: a p realized as 1 was refused as "q must be at
    least ... Got 1.0", naming a key the declaration does not hold."""
    with pytest.raises(ParameterError) as refused:
        Registry.from_toml('version = 1\n[metrics.a]\nkind = "string"\nepsilon_inf = 4\n'
                           'epsilon_1 = 1\np = 0.99999999999\n')
    assert refused.value.field == "metrics.a.p"
    assert "leaves no q above it" in str(refused.value)


def test_a_huge_integer_is_shown_by_its_digits_in_every_field_check() -> None:
    """check_fields wrote the whole repr: 4,000 digits of k made a 4,092-character message."""
    with pytest.raises(ParameterError) as refused:
        Registry.from_toml(f'version = 1\n[metrics.a]\nkind = "string"\nk = {"9" * 4000}\n')
    assert "Got an integer of about 4001 digits instead." in str(refused.value)
    assert len(str(refused.value)) < 200
