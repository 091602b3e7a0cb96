"""Short version of the load / soak benchmark (benchmarks/robustness.py): a real `irpe serve`
process overloaded at 4x its measured capacity answers every request 200 or 503."""
from __future__ import annotations

from benchmarks.robustness import markdown, run


def test_overload_answers_every_request_200_or_503_and_soak_reports_rss():
    result = run(overload_s=2.0, soak_s=2.0, max_batch=4, calibrate_s=1.0)
    o, s = result["overload"], result["soak"]
    assert result["capacity_rps"] > 0 and o["sent"] > 0
    assert o["lost"] == 0 and o["answered"] == o["sent"], o
    assert set(o["status"]) <= {"200", "503"} and o["other_5xx"] == 0, o
    assert o["accepted_p99_ms"] is not None and o["accepted_p99_ms"] >= o["accepted_p50_ms"]
    assert s["requests"] > 0 and set(s["status"]) == {"200"}, s
    assert s["rss_end_mib"] > 0 and "RSS growth after warm-up" in markdown(result)
