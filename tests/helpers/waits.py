"""Ordering by state, not by sleeps: poll until true, a daemon's log, gather that cancels."""

from __future__ import annotations

import asyncio
import time

from crnet.tools.launch import LocalTree


async def wait_until(check, what: str, timeout: float = 30.0, every: float = 0.02):
    """Poll ``await check()`` (or ``check()``) until it is true: ordering by state, not by sleeps."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        ok = check()
        if asyncio.iscoroutine(ok):
            ok = await ok
        if ok:
            return ok
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(every)


async def wait_for_log(lt: LocalTree, name: str, text: str, timeout: float = 30.0) -> str:
    """Wait until daemon ``name``'s log contains ``text``; returns the log."""
    def check():
        log = lt.log_path(name).read_text(errors="replace")
        return log if text in log else None
    return await wait_until(check, f"{text!r} in the log of {lt.filename(name)}", timeout)


async def gather_or_cancel(*aws):
    """gather() that cancels the siblings when one fails, so no task outlives the test."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def timed(coro):
    """(outcome or exception, seconds it took)."""
    started = time.monotonic()
    try:
        result = await coro
    except Exception as e:  # noqa: BLE001 -- the outcome under test may be any error
        result = e
    return result, time.monotonic() - started
