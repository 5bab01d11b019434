"""EventRelay: engine-thread events reach each request's queue in order, with fewer loop wake-ups than events."""

from __future__ import annotations

import asyncio
import threading

from tokenseam.server.relay import EventRelay


def test_events_arrive_in_order_and_share_wake_ups():
    async def main():
        loop = asyncio.get_running_loop()
        relay = EventRelay()
        queues = [asyncio.Queue() for _ in range(4)]
        wakeups = 0
        real = loop.call_soon_threadsafe

        def counting(cb, *args):
            nonlocal wakeups
            wakeups += 1
            return real(cb, *args)

        loop.call_soon_threadsafe = counting

        def engine():  # one "step" emits to every queue back to back, 200 steps
            for step in range(200):
                for i, q in enumerate(queues):
                    relay.send(loop, q, [(i, step)])

        t = threading.Thread(target=engine)
        t.start()
        got = [[] for _ in queues]
        for i, q in enumerate(queues):
            while len(got[i]) < 200:
                got[i].extend(await asyncio.wait_for(q.get(), 10))
        t.join()
        assert got == [[(i, s) for s in range(200)] for i in range(4)]
        assert 1 <= wakeups <= 800

    asyncio.run(main())


def test_events_sent_before_the_loop_runs_share_one_wake_up():
    loop = asyncio.new_event_loop()
    try:
        relay = EventRelay()
        queues = [asyncio.Queue() for _ in range(8)]
        calls = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda cb, *a: calls.append(cb) or real(cb, *a)
        for i, q in enumerate(queues):  # one engine step: eight requests, the loop busy elsewhere
            relay.send(loop, q, [i])
        assert len(calls) == 1
        loop.run_until_complete(asyncio.sleep(0))
        assert [q.get_nowait() for q in queues] == [[i] for i in range(8)]
        relay.send(loop, queues[0], ["next step"])
        assert len(calls) == 2
    finally:
        loop.close()


def test_a_closed_loop_drops_events_without_raising():
    relay = EventRelay()
    loop = asyncio.new_event_loop()
    loop.close()
    relay.send(loop, None, ["x"])  # the engine thread must survive a server that shut down
    relay.send(loop, None, ["y"])
    assert relay._pending == {}
