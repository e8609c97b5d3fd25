"""D7 (dmls.special.serialization): what each format does with values, references, depth and
an untrusted pickle, run here; and the section's answer read from the study's own files."""

import platform

import pytest

from dmls.report.phrases import full
from dmls.special import runner
from dmls.special.serialization import measure as serialization
from dmls.special.serialization.spec import facts as serialization_facts
from dmls.summary import read as read_summary


@pytest.fixture(scope="module")
def d7(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serialization")
    runner.run_study("serialization", {"title": "D7"}, folder)
    return read_summary(folder / "summary.json"), folder


def rows_of(summary, part, **match):
    return [r for r in summary[part] if all(r[k] == v for k, v in match.items())]


def test_binary_formats_are_fixed_width_and_read_garbage_in_the_other_byte_order(d7):
    summary, _ = d7
    for r in rows_of(summary, "representation", value="0.1"):
        if r["format"] in ("struct", "numpy"):
            assert r["bytes"] == 8 and r["round_trip"] == "exact"
            assert float(r["other_order_reads"]) != 0.1
    pickled = rows_of(summary, "representation", value="0.1", format="pickle")[0]
    text = rows_of(summary, "representation", value="0.1", format="JSON")[0]
    assert pickled["bytes"] > 8 and text["bytes"] == len("0.1")


def test_what_each_format_refuses_or_changes_is_recorded_with_its_error(d7):
    summary, _ = d7
    big = "18446744073709551616 (2^64)"
    refused = {(r["format"], r["error"]) for r in rows_of(summary, "representation", value=big)
               if r["round_trip"] == "refused"}  # fmt: skip
    assert {f for f, _ in refused} == {"struct", "numpy"}
    assert any("out of range" in e or "too large" in e for _, e in refused)
    nan = rows_of(summary, "representation", value="float('nan')")
    strict = next(r for r in nan if r["format"] == "JSON, strict")
    assert strict["round_trip"] == "refused"
    assert strict["error"] == "ValueError: Out of range float values are not JSON compliant"
    assert all(r["round_trip"] == "exact" for r in nan if r["format"] == "pickle")
    float64 = rows_of(summary, "representation", value="9007199254740993 (2^53 + 1)",
                      format="JSON, float64 reader")[0]  # fmt: skip
    assert float64["round_trip"] == "changed" and float64["read_back"] == "9007199254740992.0"
    assert all(r["agree"] for r in summary["representation"])


def test_pickle_keeps_shared_references_and_cycles_json_copies_or_refuses_them(d7):
    summary, _ = d7
    got = {(r["case"], r["format"]): r for r in summary["references"]}
    assert got["shared", "pickle"]["round_trip"] == "identity kept"
    assert got["shared", "JSON"]["round_trip"] == "duplicated"
    assert got["shared", "JSON"]["bytes"] > got["shared", "pickle"]["bytes"]
    assert got["cycle", "pickle"]["identity_kept"] is True
    assert got["cycle", "JSON"]["error"] == "ValueError: Circular reference detected"


def test_nesting_depth_is_bounded_by_the_recursion_limit_except_picklings_reader():
    rows = {(r["format"], r["phase"]): r for r in serialization.depth(max_depth=5000)}
    limit = rows["pickle", "writing"]["recursion_limit"]
    for key in (("pickle", "writing"), ("JSON", "writing"), ("JSON", "reading")):
        assert 0 < rows[key]["deepest"] < limit, key
        assert rows[key]["error"].startswith("RecursionError: maximum recursion depth"), key
    # pickle reads with a stack machine: any depth, up to what was tried.
    assert (
        rows["pickle", "reading"]["deepest"] == 5000 and rows["pickle", "reading"]["error"] is None
    )


def test_torch_load_weights_only_reads_a_state_dict_and_refuses_code_that_pickle_runs(d7):
    summary, folder = d7
    state, hostile_pickle, hostile_torch = summary["trust"]
    assert state["result"].endswith("tensors, all equal") and not state["code_ran"]
    assert hostile_pickle["loader"] == "pickle.loads" and hostile_pickle["code_ran"] is True
    assert hostile_torch["result"] == "refused" and hostile_torch["code_ran"] is False
    assert "GLOBAL" in hostile_torch["error"] and "mkdir" in hostile_torch["error"]
    assert not list(folder.glob("ran-on-load-*"))  # the payload's directories are gone


def test_the_answer_reads_the_study_and_says_where_a_part_failed(d7):
    summary, folder = d7
    case, facts = serialization_facts(summary, folder)
    assert case == "measured"
    assert facts["value"] == "0.1" and facts["fixed"] == "8" and facts["json"] == "3"
    assert "float('nan') is refused by JSON, strict (ValueError)" in facts["lost"]
    assert (
        facts["cycle"].startswith("pickle identity kept") and "Circular reference" in facts["cycle"]
    )
    assert "pickle reading at least" in facts["depth"]
    assert facts["depth"].endswith(f"(Python {platform.python_version()}, recursion limit 1000)")
    assert "pickle.loads ran it" in facts["hostile"]
    # The example's Python 3.12 wrote 4,998 levels "at recursion limit 1000": the limit no
    # longer bounds C code there, and the answer says so.
    on_312 = summary | {"host": summary["host"] | {"python": "3.12.3"}}
    _, facts = serialization_facts(on_312, folder)
    assert facts["depth"].endswith(
        "(Python 3.12.3, recursion limit 1000, which bounds Python frames only, not C code such "
        "as these)"
    )
    broken = summary | {"rows": [r | {"status": "failed", "reason": "boom"} if r["part"] == "depth"
                                 else r for r in summary["rows"]]}  # fmt: skip
    _, facts = serialization_facts(broken, folder)
    assert full(facts["depth"]) == "not measured here, as it failed: boom"
    assert facts["shared"].startswith("pickle identity kept")  # the other parts still stand
