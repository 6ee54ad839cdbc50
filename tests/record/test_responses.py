"""A finished response read back for the front ends: ``busy_machine_line`` says when its model decoded it with
fewer threads than its own (they were fitted to a machine other work kept busy) or well below its quiet rate, from
numbers in a transcript that may come from anywhere."""

from hypothesis import given, strategies as st

from tensorjob_jupyter.record.responses import busy_machine_line


def test_fewer_threads_than_the_models_own_is_a_busy_machine():
    line = busy_machine_line({"type": "response.completed", "timing": {"threads": 1, "own_threads": 2}})
    assert line == "the machine is busy: decoded with 1 of the model's 2 threads (other work takes the CPUs)"
    assert busy_machine_line({"timing": {"threads": 2}}) is None  # all of them: nothing to say
    assert busy_machine_line({"timing": {"threads": 2, "own_threads": 2}}) is None
    assert busy_machine_line({}) is None and busy_machine_line({"timing": None}) is None


@given(timing=st.one_of(st.none(), st.text(), st.dictionaries(
    st.sampled_from(["threads", "own_threads", "batch"]),
    st.one_of(st.integers(-5, 1 << 20), st.booleans(), st.floats(), st.text(max_size=5), st.none()))))
def test_whatever_a_transcript_holds_the_line_is_none_or_one_plain_line_of_two_small_whole_numbers(timing):
    line = busy_machine_line({"timing": timing})
    if line is None:
        return
    assert "\n" not in line and "<" not in line
    threads, own = timing["threads"], timing["own_threads"]
    assert type(threads) is int and type(own) is int and 0 < threads < own < 1 << 16
    assert f"with {threads} of the model's {own} threads" in line


def test_a_rate_well_below_the_models_quiet_rate_is_a_busy_machine():
    slow = {"tokens_per_second": 3.04, "quiet_tokens_per_second": 9.8}
    assert busy_machine_line({"timing": slow}) == ("the machine is busy: 3.0 tokens/s against the model's 9.8 on a "
                                                   "quiet machine (other work takes the CPUs)")
    both = busy_machine_line({"timing": {**slow, "threads": 1, "own_threads": 2}})
    assert both == ("the machine is busy: decoded with 1 of the model's 2 threads, 3.0 tokens/s against the model's "
                    "9.8 on a quiet machine (other work takes the CPUs)")
    assert busy_machine_line({"timing": {"tokens_per_second": 7.0, "quiet_tokens_per_second": 9.8}}) is None
    assert busy_machine_line({"timing": {"tokens_per_second": 3.0}}) is None  # nothing to read it against


@given(timing=st.dictionaries(
    st.sampled_from(["tokens_per_second", "quiet_tokens_per_second", "threads", "own_threads"]),
    st.one_of(st.floats(), st.integers(-5, 1 << 40), st.booleans(), st.text(max_size=5), st.none())))
def test_whatever_rates_a_transcript_holds_the_line_is_none_or_one_plain_line_of_plausible_numbers(timing):
    line = busy_machine_line({"timing": timing})
    if line is None or "tokens/s" not in line:
        return
    assert "\n" not in line and "<" not in line and "nan" not in line and "inf" not in line
    rate, quiet = timing["tokens_per_second"], timing["quiet_tokens_per_second"]
    assert type(rate) in (int, float) and type(quiet) in (int, float) and 0 < rate < 0.6 * quiet < 1e7
