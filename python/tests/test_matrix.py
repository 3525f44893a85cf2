"""bench/matrix.py: Pennycook's P and the portable / best split of the portability matrix."""
import importlib.util
import pathlib

import pytest

_path = pathlib.Path(__file__).resolve().parents[2] / "bench" / "matrix.py"
_spec = importlib.util.spec_from_file_location("ompk_bench_matrix", _path)
matrix = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(matrix)


def test_pennycook_is_the_harmonic_mean():
    assert matrix.pennycook([0.5, 0.25]) == pytest.approx(1 / 3)
    assert matrix.pennycook([0.8]) == pytest.approx(0.8)
    assert matrix.pennycook([0.2, 0.4, 0.8]) == pytest.approx(3 / (5 + 2.5 + 1.25))


def test_pennycook_is_zero_where_a_platform_lacks_the_kernel():
    assert matrix.pennycook([0.5, None]) == 0.0
    assert matrix.pennycook([0.5, 0.0]) == 0.0
    assert matrix.pennycook([]) == 0.0


def test_pennycook_counts_an_efficiency_above_the_roofline_as_one():
    assert matrix.pennycook([1.5, 0.5]) == pytest.approx(2 / 3)


def rec(kernel, shape, impl, ms, gbs, copy, tflops=None, probe=None, nbytes=1e9):
    return {"backend": "gpu", "kernel": kernel, "dtype": "f32", "shape": shape, "ms": ms,
            "gb_per_s": gbs, "copy_gb_per_s": copy, "tflop_per_s": tflops,
            "flops": 1.0 if tflops else 0.0, "fp32_probe_tflops": probe, "peak": "fp32",
            "bytes": nbytes, "impl": impl}


def run(label, records):
    return {"label": label, "path": label + ".json", "backend": "gpu", "records": records,
            "machine": {}}


def test_rows_split_portable_and_best_per_platform():
    a = run("a", [rec("mhc_post_fwd", "B4 S4096", "portable", 2.0, 500, 1000),
                  rec("mhc_post_fwd", "B4 S4096", "tuned", 1.0, 800, 1000),
                  # compute-bound: the FLOP roofline (probe) is the larger fraction
                  rec("attention_fwd", "B4 N4096 causal", "portable", 5.0, 10, 1000, 20, 40)])
    b = run("b", [rec("mhc_post_fwd", "B1 S1024", "portable", 1.0, 25, 100, nbytes=1e8),
                  rec("mhc_post_fwd", "B1 S1024", "other", 1.0, 50, 100, nbytes=1e8)])
    rows = {(r["kernel"], r["shape"]): r for r in matrix.build([a, b])}
    post = rows[("mhc_post_fwd", "-")]  # sizes differ, one shape class
    assert post["cells"]["a"]["portable"]["eff"] == pytest.approx(0.5)
    assert post["cells"]["a"]["best"]["eff"] == pytest.approx(0.8)
    assert post["cells"]["a"]["best"]["impl"] == "tuned"
    assert post["cells"]["b"]["best"]["eff"] == pytest.approx(0.5)
    assert post["P_portable"] == pytest.approx(2 / (2 + 4))
    assert post["P_best"] == pytest.approx(2 / (1 / 0.8 + 2))
    att = rows[("attention_fwd", "causal")]
    assert att["cells"]["a"]["portable"]["eff"] == pytest.approx(0.5)
    assert "b" not in att["cells"]
    assert att["P_portable"] == 0.0 and att["P_best"] == 0.0


def test_portable_cell_at_the_largest_shape_the_portable_kernel_ran():
    # a slow portable kernel benchmarked at a smaller shape than the tuned one still has a cell
    a = run("a", [rec("attention_bwd", "B4 N4096", "tuned", 1.0, 800, 1000, nbytes=4e9),
                  rec("attention_bwd", "B1 N2048", "portable", 1.0, 300, 1000, nbytes=1e9),
                  rec("attention_bwd", "B1 N1024", "portable", 1.0, 100, 1000, nbytes=5e8)])
    row = matrix.build([a])[0]
    assert row["cells"]["a"]["portable"]["eff"] == pytest.approx(0.3)
    assert row["cells"]["a"]["portable"]["shape"] == "B1 N2048"
    assert row["cells"]["a"]["best"]["eff"] == pytest.approx(0.8)


def test_portable_is_what_ran_else_the_variant_label():
    r = rec("mhc_pre_fwd", "B4", None, 1.0, 100, 1000)
    del r["impl"]
    r["variant"] = "portable"
    assert matrix.is_portable(r)
    r["variant"] = "tc"
    assert not matrix.is_portable(r)
    r["impl"], r["variant"] = None, "portable-2t"  # MoE: no impl list entry ran, the label says
    assert matrix.is_portable(r)
    r["impl"], r["variant"] = "tc-bf16", "portable"  # what ran wins over the label
    assert not matrix.is_portable(r)
