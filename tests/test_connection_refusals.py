"""RefusalLog's bound on the addresses it tallies one by one (the servers' tests cover the lines it writes)."""

from __future__ import annotations

from ledgerview.connection_refusals import ADDRESSES_TALLIED, RefusalLog, RefusalSummary


def test_refusals_from_more_addresses_than_are_tallied_are_still_counted() -> None:
    now = [0.0]
    lines: list[RefusalSummary] = []
    refusals = RefusalLog(lines.append, clock=lambda: now[0])
    refusals.refused("10.0.0.0")  # the first refusal's line
    for number in range(ADDRESSES_TALLIED + 50):
        refusals.refused(f"10.1.{number // 256}.{number % 256}")
    refusals.refused("10.1.0.0")  # tallied already: counted by address
    now[0] = refusals.interval_s
    refusals.write_due()
    assert [line.refused for line in lines] == [1, ADDRESSES_TALLIED + 51]
    assert (lines[1].addresses, lines[1].refused_from_addresses_not_tallied) == (ADDRESSES_TALLIED, 50)
    assert (lines[1].top_client, lines[1].top_client_refused) == ("10.1.0.0", 2)
