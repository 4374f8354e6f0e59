"""The benchmark's report without a GPU: ExecuTorch on device tensors against the C API is the
median of call-for-call differences, the host goal is marked met or missed, and the staging
sweep's table gives each setting's rate and fraction of the pinned rate."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_bench():
    spec = importlib.util.spec_from_file_location("kiln_bench_script", os.path.join(ROOT, "bench", "bench.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = load_bench()
LINKS = {"h2d": 50e9, "d2h": 50e9, "host_copy": {1: 6e9}}


def row(et, et_dev, dev, in_bytes=1 << 20, out_bytes=1 << 20):
    return {"model": "mlp", "batch": 1, "dtype": "float16", "param_bytes": 1, "in_bytes": in_bytes,
            "out_bytes": out_bytes, "bytes": 1 + in_bytes + out_bytes, "kiln_et": et, "kiln_et_dev": et_dev,
            "kiln_dev": dev, "kiln_c": et, "eager": [100.0] * len(dev), "compile": [100.0] * len(dev),
            "blobs": 1, "goal": 0.5}


def test_et_dev_minus_dev_pairs_the_calls():
    # The GPU's clock steps up halfway: each pair differs by 2 us, the medians by 102.
    dev = [1000.0] * 5 + [1100.0] * 6
    et_dev = [1002.0] * 6 + [1102.0] * 5
    assert bench.et_dev_minus_dev(row(dev, et_dev, dev)) == 2.0
    # Not timed side by side (different counts): the difference of the medians, 1002 - 1100.
    assert bench.et_dev_minus_dev(row(dev, et_dev[:10], dev)) == -98.0


def test_host_goal_and_link_fraction():
    dev = [100.0] * 9
    wire = (1 << 20) / 50e9 * 2e6  # in and out at the pinned rate, us
    goal = 100 + 10 + wire / 0.7
    met = bench.link_columns(row([goal - 1] * 9, [101.0] * 9, dev), LINKS).split(" | ")
    assert met[0] == "1.0 (met)" and met[1] == f"{goal:.0f} (met)"
    assert float(met[3]) == round(wire / (goal - 1 - 100), 2)
    missed = bench.link_columns(row([goal + 5] * 9, [125.0] * 9, dev), LINKS).split(" | ")
    assert missed[0] == "25.0 (missed)" and missed[1].endswith("(missed)")
    # The host path timed no slower than the bytes' time at the link's rate: noise, no fraction.
    for et in (99.0, 100.0 + wire):
        assert bench.link_columns(row([et] * 9, [101.0] * 9, dev), LINKS).split(" | ")[3] == "-"


def test_sweep_table_lists_every_setting():
    results = [{"threads": t, "chunk_kib": c, "rate": t * 10e9, "host_us": 0.0, "dev_us": 0.0}
               for t in (1, 4) for c in (512, 2048)]
    text = bench.sweep_table({"bytes": 1 << 26, "results": results}, LINKS)
    lines = text.splitlines()
    assert "| threads | 512 KiB | 2048 KiB |" in lines
    assert "| 1 | 10.0 (0.20) | 10.0 (0.20) |" in lines
    assert "| 4 | 40.0 (0.80) | 40.0 (0.80) |" in lines
    header = bench.table([row([100.0] * 9, [101.0] * 9, [100.0] * 9)], 4e12, "GPU", "2026-12-01", LINKS,
                         {"threads": "8", "chunk_kib": "2048", "source": "the defaults"},
                         {"bytes": 1 << 26, "results": results})
    assert "Host staging: 8 threads, chunks of at most 2048 KiB (the defaults)." in header
    assert "Host staging sweep: 64 MiB in and 64 MiB out" in header
