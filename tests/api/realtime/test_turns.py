"""Server VAD turn-taking (`skulk.api.realtime.turns`): probabilities in, events out."""

from __future__ import annotations

import pytest

from skulk.api.realtime.turns import WINDOW_MS, TurnEvent, TurnSettings, TurnState, steps

S, Q = 0.9, 0.1  # a speech window, a silent one
SETTINGS = TurnSettings(threshold=0.5, prefix_padding_ms=64, silence_duration_ms=96, min_speech_ms=96,
                        max_utterance_ms=640)


def started(ms: int) -> TurnEvent:
    return TurnEvent("speech_started", ms)


def stopped(ms: int, start: int) -> TurnEvent:
    return TurnEvent("speech_stopped", ms, start)


@pytest.mark.parametrize(("windows", "expected"), [
    ([Q] * 10, ()),
    # two speech windows are under min_speech (96 ms = 3 windows): a click opens no turn
    ([Q, S, S, Q, Q, Q], ()),
    # three open it; it starts prefix_padding (64 ms) before the first speech window (w2 = 64 ms)
    ([Q, Q, S, S, S], (started(0),)),
    ([Q, Q, Q, Q, S, S, S], (started(4 * WINDOW_MS - 64),)),
    # three silent windows (96 ms) end it at the end of the third
    ([Q, Q, Q, Q, S, S, S, Q, Q, Q], (started(64), stopped(10 * WINDOW_MS, 64))),
    # a pause shorter than the hangover does not
    ([Q, Q, Q, Q, S, S, S, Q, Q, S, Q, Q], (started(64),)),
    # between threshold and release (0.5 - 0.15) counts as neither silence nor a break
    ([Q, Q, Q, Q, S, S, S, 0.4, 0.4, 0.4, 0.4], (started(64),)),
    ([Q, Q, Q, Q, S, S, S, 0.3, 0.3, 0.3], (started(64), stopped(10 * WINDOW_MS, 64))),
    # max utterance (640 ms) cuts a turn that never pauses, and listening goes on
    ([Q, Q, Q, Q] + [S] * 21, (started(64), stopped(704, 64), started(704 - 64))),
])
def test_turns(windows: list[float], expected: tuple[TurnEvent, ...]) -> None:
    assert steps(SETTINGS, TurnState(), windows)[1] == expected


def test_the_windows_can_arrive_in_any_grouping() -> None:
    windows = [Q, Q, Q, S, S, S, S, Q, Q, Q, Q, S, S, S, Q, Q, Q]
    whole = steps(SETTINGS, TurnState(), windows)
    state, events = TurnState(), ()
    for window in windows:
        state, more = steps(SETTINGS, state, [window])
        events += more
    assert (state, events) == whole


def test_padding_never_reaches_before_the_session() -> None:
    assert steps(TurnSettings(prefix_padding_ms=1000, min_speech_ms=32), TurnState(), [S])[1] == (started(0),)
