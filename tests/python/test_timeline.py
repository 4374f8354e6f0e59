"""The kernel timeline's analysis without a GPU: kernels split into calls at gaps longer than the
threshold (a kernel launched early, overlapping the one ahead, stays in its call), and a call's
span and gaps (negative where kernels overlap)."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("kiln_timeline_script", os.path.join(ROOT, "bench", "timeline.py"))
timeline = importlib.util.module_from_spec(spec)
spec.loader.exec_module(timeline)


def kernel(ts, dur, name="k"):
    return {"ts": ts, "dur": dur, "name": name}


def test_calls_split_at_long_gaps_only():
    gap = timeline.CALL_GAP_US
    # A long kernel with a short one inside it: the next starts 10 us after the long one ends,
    # though long after the short one ended.
    first = [kernel(0.0, 3 * gap), kernel(5.0, 1.0), kernel(3 * gap + 10.0, 4.0)]
    second = [kernel(3 * gap + 14.0 + gap + 1.0, 2.0)]
    calls = timeline.split_calls(list(reversed(first + second)))  # order of the trace: any
    assert [len(c) for c in calls] == [3, 1]
    assert calls[0][0]["ts"] == 0.0 and calls[1][0]["ts"] == second[0]["ts"]


def test_span_and_gaps():
    span, gaps = timeline.span_and_gaps([kernel(0.0, 10.0), kernel(12.0, 5.0)])
    assert (span, gaps) == (17.0, 2.0)
    # launched early: the second starts before the first ends
    span, gaps = timeline.span_and_gaps([kernel(0.0, 10.0), kernel(6.0, 8.0)])
    assert (span, gaps) == (14.0, -4.0)
    # the last to start is not the last to end
    span, gaps = timeline.span_and_gaps([kernel(0.0, 30.0), kernel(6.0, 8.0)])
    assert (span, gaps) == (30.0, -8.0)


def test_span_shares_sum_to_the_span():
    # the second launched early and ends after the first: it adds its end past the first's; the
    # third ends inside the second: nothing; the fourth starts after a gap: the gap and itself
    call = [kernel(0.0, 10.0), kernel(6.0, 8.0), kernel(7.0, 2.0), kernel(20.0, 5.0)]
    shares = timeline.span_shares(call)
    assert shares == [10.0, 4.0, 0.0, 11.0]
    assert sum(shares) == timeline.span_and_gaps(call)[0]
