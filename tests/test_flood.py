"""4 ranks each calling mpinb.report() 2,000 times a second for 10 s, in a kernel behind a real Jupyter server.

The server applies its default IOPub limits (1,000 messages/s and 1 MB/s over 3 s windows) and would replace
what the browser gets with a warning if they tripped. Afterwards mpinb.metrics() must hold every value exactly.
"""

import asyncio
import json

import pytest
from conftest import text_of
from lab_server import RATE_LIMIT_WARNINGS, JupyterServer, busiest, outputs_of

pytestmark = [pytest.mark.mpi, pytest.mark.server, pytest.mark.slow, pytest.mark.timeout(300)]

RANKS, RATE, SECONDS = 4, 2000, 10

FLOOD = f"""%%mpi
import time, mpinb
t0 = time.perf_counter()
sent = 0
while sent < {RATE * SECONDS}:
    mpinb.report(step=sent, loss=rank * 1e6 + sent * 0.5)
    sent += 1
    ahead = t0 + sent / {RATE} - time.perf_counter()
    if ahead > 0:
        time.sleep(ahead)
print(f"reported {{sent}} values in {{time.perf_counter() - t0:.2f}} s")
"""

CHECK = f"""
import json
import numpy as np
import mpinb
df = mpinb.metrics()
live = get_ipython().magics_manager.registry["MPIMagics"].live
checks = {{}}
for r in range({RANKS}):
    mine = df[df["rank"] == r]
    checks[r] = dict(rows=len(mine), steps=bool((mine.step.to_numpy() == np.arange({RATE * SECONDS})).all()),
                     exact=bool((mine.value.to_numpy() == r * 1e6 + mine.step.to_numpy() * 0.5).all()),
                     last=float(mine.value.iloc[-1]))
print(json.dumps(dict(checks=checks, batches=live.batches, refreshes=live.refreshes, messages=live.view.messages)))
"""


async def flood(root):
    with JupyterServer(root) as server:
        kernel = await server.websocket_kernel()
        started = text_of(outputs_of(await kernel.execute(f"%load_ext mpinb\n%mpi start -n {RANKS}")))
        assert f"MPI world of {RANKS} ranks started" in started, started
        flooded = await kernel.execute(FLOOD)
        checked = text_of(outputs_of(await kernel.execute(CHECK)))
        await kernel.execute("%mpi stop")
        await kernel.close()
        return flooded, checked


def test_flood_of_reports_stays_under_iopub_limits_and_loses_nothing(tmp_path):
    flooded, checked = asyncio.run(flood(tmp_path))
    printed = text_of(outputs_of(flooded))
    assert not any(warning in printed for warning in RATE_LIMIT_WARNINGS), printed
    assert printed.count(f"reported {RATE * SECONDS} values") == RANKS, printed
    counted = [(when, m) for when, m in flooded if m["msg_type"] not in ("status", "comm_open", "execute_input")]
    # the server's own rule is the average over 3 s; no single second comes near the limit either
    peak_messages = busiest(counted, seconds=1)
    peak_bytes = busiest(counted, seconds=1, size=lambda m: m["wire_bytes"])
    # the README's claim: about 20 widget messages a second however fast the ranks report (redraws are at least
    # refresh_interval apart, so this holds on a busy machine too); the server's IOPub limit is 1000
    assert peak_messages <= 40
    assert peak_bytes < 1_000_000
    assert any("application/vnd.jupyter.widget-view+json" in m["content"].get("data", {}) for _, m in flooded)
    result = json.loads(checked.strip().splitlines()[-1])
    for rank in range(RANKS):
        assert result["checks"][str(rank)] == dict(rows=RATE * SECONDS, steps=True, exact=True,
                                                   last=rank * 1e6 + (RATE * SECONDS - 1) * 0.5)
    assert result["refreshes"] < result["batches"]
    assert result["messages"] <= 40 * SECONDS
    print(f"\nIOPub messages in the busiest second: {peak_messages}; bytes: {peak_bytes}; "
          f"rank batches {result['batches']}, redraws {result['refreshes']}, widget messages {result['messages']}")
