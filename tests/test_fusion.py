"""Merging ranked lists (_ragproxy.fusion): zscore_fusion, rrf and reciprocal_ranks, in-process.

Pure functions over hand-made lists; every expected value is worked out by
hand from the formulas in the module's docstrings.
"""
import pytest

from _ragproxy import fusion


def test_rrf_fusion_is_weighted_reciprocal_rank():
    fused = fusion.rrf([("lexical", [(1, 9.0), (2, 5.0)], 1.0), ("dense", [(2, 0.9), (3, 0.8)], 1.0)])
    assert [row for row, _, _ in fused] == [2, 1, 3]
    assert fused[0][1] == pytest.approx(1 / 62 + 1 / 61)
    assert fused[0][2] == {"lexical": 5.0, "dense": 0.9, "rrf": fused[0][1]}


def test_zscore_fusion_scales_each_list_by_its_own_distribution():
    lexical = [(1, 12.0), (2, 8.0), (3, 4.0)]          # mean 8, sd 3.266
    dense = [(3, 0.90), (4, 0.80), (2, 0.70)]          # mean 0.8, sd 0.0816
    fused = fusion.zscore_fusion([("lexical", lexical, 1.0), ("dense", dense, 2.0)])
    scale = lambda s, mean, sd: (s - (mean - 3 * sd)) / (6 * sd)  # noqa: E731
    sd_l, sd_d = (32 / 3) ** 0.5, (0.02 / 3) ** 0.5
    want = {1: scale(12, 8, sd_l), 2: scale(8, 8, sd_l) + 2 * scale(0.7, 0.8, sd_d),
            3: scale(4, 8, sd_l) + 2 * scale(0.9, 0.8, sd_d), 4: 2 * scale(0.8, 0.8, sd_d)}
    assert [row for row, _, _ in fused] == sorted(want, key=lambda r: -want[r])
    for row, value, detail in fused:
        assert value == pytest.approx(want[row]) and detail["fused"] == value
    assert fused[0][0] == 3  # strong in dense (weight 2), weak in lexical
    # A list with one score (sd 0) must not divide by zero.
    assert fusion.zscore_fusion([("lexical", [(7, 3.0)], 1.0), ("dense", [], 1.0)])[0][0] == 7


def test_reciprocal_ranks_sums_weight_over_k_plus_rank_in_first_seen_order():
    fused = fusion.reciprocal_ranks([(["a", "b", "c"], 1.0), (["c", "d"], 2.0)])
    assert list(fused) == ["a", "b", "c", "d"]           # the order keys were first seen, not by value
    assert fused["a"] == pytest.approx(1 / 61)           # ranks count from 1, k = 60
    assert fused["b"] == pytest.approx(1 / 62)
    assert fused["c"] == pytest.approx(1 / 63 + 2 / 61)  # summed over the lists, each weighted
    assert fused["d"] == pytest.approx(2 / 62)
    assert fusion.reciprocal_ranks([([], 1.0)]) == {}


def test_rrf_ties_go_to_the_lower_row():
    # Rows 9 and 4 each hold rank 1 in one list and rank 2 in the other: equal fused values.
    fused = fusion.rrf([("lexical", [(9, 5.0), (4, 3.0)], 1.0), ("dense", [(4, 0.9), (9, 0.1)], 1.0)])
    assert fused[0][1] == fused[1][1] == pytest.approx(1 / 61 + 1 / 62)
    assert [row for row, _, _ in fused] == [4, 9]
    # A row seen only in the second list ties with one seen only in the first.
    fused = fusion.rrf([("lexical", [(7, 1.0)], 1.0), ("dense", [(3, 1.0)], 1.0)])
    assert [row for row, _, _ in fused] == [3, 7]
